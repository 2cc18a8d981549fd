"""The model layer's defaults that the stage programs' --help shows (local/average.py, local/train.py),
in a module that imports nothing: --help starts in tenths of a second, not the seconds torch takes.
model/averaging.py and model/adapters.py use them from here.
"""

from __future__ import annotations

# A checkpoint whose recorded validation loss is more than this fraction of the best's above the best's
# is left out of the average (model/averaging.py ``plan``).
LOSS_MARGIN = 1.0
ALPHA_PER_RANK = 2.0  # LoRA alpha = 2 * rank: the scale the LoRA paper's follow-ups and peft's examples use
# SenseVoiceSmall's SANM encoder blocks (encoders0, encoders, tp_encoders): attention and feed-forward.
DEFAULT_TARGETS = ("linear_q_k_v", "linear_out", "w_1", "w_2")
