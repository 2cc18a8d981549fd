"""Shared test helpers: corpora and model dirs built in tmp, run.sh and torchrun launchers, fixtures."""
