"""Models: configs, tokenizers, the recipe's classes, checkpoints, hub-format model dirs, the trainer."""
