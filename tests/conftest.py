"""Fixtures shared across test files (pytest finds them here)."""

from tests.stage1_data import corpus, dumped  # noqa: F401  (session fixtures: real sets and their stage 1)
from tests.train_fixtures import finetuned, prepared, trained  # noqa: F401  (session: stages 0-2 runs)
