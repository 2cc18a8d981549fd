"""The recipe's own logic behind its hooks on funasr's trainer (funasr_recipe/compat/ installs them): live
metrics, memory planning and the out-of-memory probe, collective timing, activation checkpointing, the
learning-rate schedule, the utterances training would leave out."""
