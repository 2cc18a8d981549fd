"""What the recipe adds to funasr's trainer while it runs: live metrics, memory planning and the out-of-memory
probe, activation checkpointing, the learning-rate schedule."""
