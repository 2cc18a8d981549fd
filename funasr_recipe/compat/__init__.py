"""Everything that reaches into funasr's (and DeepSpeed's, and torch's) own code: the recipe's hooks on
funasr's trainer (metrics, memory plan and OOM probe, divergence guard, atomic checkpoints, freezing and
LoRA), the CPU patch, funasr's losses in fewer passes, funasr imported without its model zoo. Each change
goes through patching.py against the surface pins.py pins, and install.py installs them in their one
order after checking that surface, so a funasr upgrade fails in one place with every difference named."""
