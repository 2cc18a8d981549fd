"""Stage 4's parity thresholds and threads, the defaults of local/export.py's --help, in a module that
imports nothing (runtime/parity.py, which checks with them, imports torch: seconds).
"""

from __future__ import annotations

MIN_IDENTICAL = 0.99
MAX_INT8_WER_DELTA = 0.01
# Threads of each side. Small inputs leave a second thread little to do but wait, and a wait that
# another process's work can stretch: one utterance at a time on the demo's 2 cores, 100 dev clips took
# PyTorch 0.9-1.4 s on 1 thread and 0.9 s on 2 with the cores idle, but 10-28 s on 2 with another
# process running (ONNX fp32: 0.3-0.6 s, 0.4 s, 1.4-1.5 s). The whole check of the 500 clips, batched by
# length, took 5.7 s on 1 thread and 4.9 s on 2, idle.
PARITY_THREADS = 1
