"""Batches cut from a length order under funasr's budget: for the training sampler and for decoding.

Pure numpy: no funasr import, so decoding and the benchmarks cut their batches without the registry.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.rejections import BadInputError


class SourceLengths:
    """What a batch sampler reads of a funasr dataset (its length, each utterance's source and target
    length), without the dataset: batches planned from a manifest's ``source_len`` alone."""

    def __init__(self, lengths: list[int], target_lengths: list[int] | None = None) -> None:
        self.lengths = list(lengths)
        self.target_lengths = list(target_lengths) if target_lengths is not None else [1] * len(self.lengths)

    @classmethod
    def from_manifest(cls, jsonl: Path) -> SourceLengths:
        """``source_len`` and ``target_len`` of every line of a data.jsonl."""
        rows = [obj for _, obj in iter_jsonl(jsonl)]
        return cls([int(o["source_len"]) for o in rows], [int(o.get("target_len", 1)) for o in rows])

    def __len__(self) -> int:
        return len(self.lengths)

    def get_source_len(self, i: int) -> int:
        return self.lengths[i]

    def get_target_len(self, i: int) -> int:
        return self.target_lengths[i]


def cut_batches(order: np.ndarray, lengths: np.ndarray, batch_size: int, batch_type: str,
                max_utts: int) -> tuple[list[list[int]], int]:
    """Greedy batches along ``order``: (batches, count of single utterances over the budget).

    The budget is funasr's: for "token", the longest source length in the batch x its number of
    utterances <= batch_size (padded frames); for "example", at most batch_size utterances. Either way
    a batch holds at most ``max_utts`` utterances (funasr's batch_size_sample_max). An utterance alone
    over the budget becomes a batch of one, never dropped.
    """
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    oversized = 0
    # Plain Python ints: indexing a numpy array once per utterance would dominate this loop.
    sizes = lengths[order].tolist() if batch_type == "token" else [1] * len(order)
    for idx, n in zip(order.tolist(), sizes, strict=True):
        if n > batch_size:
            oversized += 1
        if batch and (max(longest, n) * (len(batch) + 1) > batch_size or len(batch) >= max_utts):
            batches.append(batch)
            batch, longest = [], 0
        batch.append(idx)
        longest = max(longest, n)
    if batch:
        batches.append(batch)
    return batches, oversized


def split_to_multiple(batches: list[list[int]], world_size: int) -> list[list[int]]:
    """``batches`` with the largest (most utterances) split in two until their count is a multiple of
    ``world_size``; each batch keeps its order, so a length-sorted batch splits into short and long
    halves, each within the budget. Raises ValueError when there are fewer utterances than ranks."""
    batches = list(batches)
    while len(batches) % world_size:
        i = max(range(len(batches)), key=lambda j: len(batches[j]))
        if len(batches[i]) < 2:
            raise BadInputError(f"{len(batches)} utterances for {world_size} ranks: every rank needs at "
                                "least one batch; use fewer processes")
        half = len(batches[i]) // 2
        batches[i : i + 1] = [batches[i][:half], batches[i][half:]]
    return batches


def consecutive_batches(lengths: list[int], max_utts: int, max_frames: int) -> list[list[int]]:
    """Indices 0..n-1 in order, cut into batches of at most ``max_utts`` utterances and ``max_frames``
    padded frames (longest x utterances); one over the budget is a batch of its own."""
    order = np.arange(len(lengths))
    return cut_batches(order, np.asarray(lengths, dtype=np.int64), max_frames, "token", max_utts)[0]
