"""Fixtures shared across test files (pytest finds them here)."""

from tests.stage1_data import corpus, dumped  # noqa: F401  (session fixtures: real sets and their stage 1)
