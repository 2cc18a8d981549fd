"""LengthBucketBatchSampler (local/batch_sampler.py): coverage, padding, per-epoch order, ranks, resume.

Reads and writes nothing: the corpus is a seeded lognormal list of source lengths in 10 ms frames
(median 4 s, like read speech), so the tests run in a fresh clone. Ranks are simulated with the
sampler's explicit rank/world_size arguments; funasr's own sampler takes them only from
torch.distributed, which is not initialised here (so it runs as rank 0 of 1).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from funasr.datasets.dataloader_entry import DataloaderMapStyle
from funasr.register import tables

import funasr_recipe.data.batch_sampler  # noqa: F401  (registers LengthBucketBatchSampler)
from funasr_recipe.data.batch_sampler import (
    BucketBatchSampler,
    cut_batches,
    length_bucket_batch_sampler,
    split_to_multiple,
)
from funasr_recipe.data.batching import SourceLengths

BATCH = 6000  # padded frames per rank, as in conf/tiny_sensevoice.yaml


class Lengths(SourceLengths, torch.utils.data.Dataset):
    """The part of a funasr dataset a batch sampler reads, plus items and a collator for a DataLoader."""

    def __init__(self, lengths: list[int]) -> None:
        super().__init__(lengths, [max(1, n // 20) for n in lengths])

    def __getitem__(self, i: int) -> int:
        return i

    @staticmethod
    def collator(items: list[int]) -> list[int]:
        return items


@tables.register("dataset_classes", "TestBatchSamplerLengths")
class RegisteredLengths(Lengths):
    """Built by funasr's DataloaderMapStyle from a "data list" that is the number of utterances."""

    def __init__(self, path: str, frontend=None, tokenizer=None, is_training: bool = True, **kw) -> None:
        super().__init__(realistic_lengths(int(path)))


def realistic_lengths(n: int = 3000, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(400), 0.5, n)), 50, 3000).astype(int).tolist()


def sampler(lengths: list[int], **kw) -> BucketBatchSampler:
    kw = {"batch_size": BATCH, "batch_type": "token", "rank": 0, "world_size": 1, **kw}
    return BucketBatchSampler(Lengths(lengths), **kw)


def rank_lists(lengths: list[int], world: int, epoch: int, **kw) -> list[list[list[int]]]:
    out = []
    for r in range(world):
        s = sampler(lengths, rank=r, world_size=world, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


def padding(batches: list[list[int]], lengths: list[int]) -> float:
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    return 1.0 - sum(lengths[i] for b in batches for i in b) / padded


def test_every_utterance_exactly_once_per_epoch_on_any_world_size() -> None:
    lengths = realistic_lengths()
    for world in (1, 2, 3, 4, 7):
        for epoch in (0, 1):
            ranks = rank_lists(lengths, world, epoch)
            seen = [i for rank in ranks for b in rank for i in b]
            assert sorted(seen) == list(range(len(lengths))), f"world {world}: lost or repeated utterances"
            assert len({len(rank) for rank in ranks}) == 1, f"world {world}: unequal step counts"


def test_remainder_batches_are_split_not_dropped() -> None:
    batches = [[0, 1, 2, 3], [4, 5], [6]]
    assert split_to_multiple(batches, 1) == batches
    assert split_to_multiple(batches, 2) == [[0, 1], [2, 3], [4, 5], [6]]
    assert split_to_multiple(batches, 5) == [[0], [1], [2, 3], [4, 5], [6]]
    with pytest.raises(ValueError, match="7 utterances for 8 ranks"):
        split_to_multiple([[i] for i in range(7)], 8)


def test_padding_stays_under_2_5_percent_of_frames() -> None:
    lengths = realistic_lengths()
    for epoch in (0, 1, 2):
        s = sampler(lengths)
        s.set_epoch(epoch)
        assert padding(list(s), lengths) <= 0.025
    jittered = sampler(lengths, length_jitter=0.01)
    assert padding(list(jittered), lengths) <= 0.025


def test_batch_order_changes_per_epoch_and_is_identical_on_every_rank() -> None:
    lengths = realistic_lengths()
    lists = {}
    for epoch in (0, 1):
        for rank in (0, 1):
            s = sampler(lengths, rank=rank, world_size=2)
            s.set_epoch(epoch)
            lists[epoch, rank] = s.epoch_batches()
    assert lists[0, 0] == lists[0, 1] and lists[1, 0] == lists[1, 1]
    assert lists[0, 0] != lists[1, 0]
    # Not sorted by length any more: a batch of long utterances can come first.
    maxima = [max(lengths[i] for i in b) for b in lists[0, 0]]
    assert maxima != sorted(maxima)
    # Same (seed, epoch) in a new process gives the same list; another seed another one.
    again = sampler(lengths, rank=1, world_size=2)
    again.set_epoch(1)
    assert again.epoch_batches() == lists[1, 0]
    other_seed = sampler(lengths, rank=1, world_size=2, seed=7)
    other_seed.set_epoch(1)
    assert other_seed.epoch_batches() != lists[1, 0]


def test_batches_themselves_change_between_epochs() -> None:
    # Integer frame lengths tie a lot; the random tiebreak regroups equal-length utterances.
    lengths = realistic_lengths()
    contents = []
    for epoch in (0, 1):
        s = sampler(lengths)
        s.set_epoch(epoch)
        contents.append({frozenset(b) for b in s})
    assert contents[0] != contents[1]


def test_every_rank_gets_the_same_number_of_batches() -> None:
    lengths = realistic_lengths(1000)
    for world in (2, 3, 5, 8):
        for epoch in (0, 1, 2):
            per_rank = rank_lists(lengths, world, epoch)
            counts = {len(b) for b in per_rank}
            assert len(counts) == 1 and counts.pop() > 0, (world, epoch)
            s = sampler(lengths, rank=world - 1, world_size=world)
            s.set_epoch(epoch)
            assert len(s) == len(per_rank[-1])


def test_token_and_example_budgets_are_respected() -> None:
    lengths = realistic_lengths()
    batches = list(sampler(lengths))
    assert all(max(lengths[i] for i in b) * len(b) <= BATCH for b in batches)
    # Short utterances: the count cap (funasr's batch_size_sample_max) binds before the frames do.
    short = list(sampler([20] * 500, batch_size_sample_max=50))
    assert max(len(b) for b in short) == 50
    examples = list(sampler(lengths, batch_type="example", batch_size=16))
    assert max(len(b) for b in examples) == 16
    assert sorted(i for b in examples for i in b) == list(range(len(lengths)))


def test_over_budget_utterance_is_a_batch_of_one_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    lengths = realistic_lengths(300) + [BATCH + 1, 3 * BATCH]
    with caplog.at_level(logging.WARNING, logger="funasr_recipe.data.batch_sampler"):
        s = sampler(lengths, shuffle=False)
        batches = list(s)
    assert [len(lengths) - 2] in batches and [len(lengths) - 1] in batches
    assert "2 utterances are alone over batch_size" in caplog.text
    # A max_token_length in dataset_conf is honoured, and said.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="funasr_recipe.data.batch_sampler"):
        limited = sampler(lengths, max_token_length=BATCH)
    assert "2 of 302 utterances have source_len > max_token_length" in caplog.text
    assert len(lengths) - 1 not in {i for b in limited for i in b}


def test_fewer_batches_than_ranks_are_split_and_fewer_utterances_is_an_error() -> None:
    halves = [list(sampler([100] * 10, rank=r, world_size=2)) for r in (0, 1)]
    assert [len(h) for h in halves] == [1, 1]
    assert sorted(i for h in halves for b in h for i in b) == list(range(10))
    with pytest.raises(ValueError, match="3 utterances for 4 ranks"):
        list(sampler([100] * 3, rank=0, world_size=4))
    with pytest.raises(ValueError, match="outside world size"):
        sampler([100] * 10, rank=2, world_size=2)


def test_start_step_skips_exactly_the_first_batches_of_this_rank() -> None:
    lengths = realistic_lengths()
    for k in (0, 1, 5):
        for rank in (0, 1):
            whole = sampler(lengths, rank=rank, world_size=2)
            resumed = sampler(lengths, rank=rank, world_size=2, start_step=k)
            whole.set_epoch(3)
            resumed.set_epoch(3)
            full = list(whole)
            assert list(resumed) == full[k:]
            assert len(resumed) == len(full) - k
    past = sampler(lengths, start_step=10_000)
    assert list(past) == [] and len(past) == 0


def test_validation_is_sorted_deterministic_and_complete() -> None:
    lengths = realistic_lengths(1000)
    runs = []
    for epoch in (0, 1):
        s = sampler(lengths, is_training=False, length_jitter=0.05)
        s.set_epoch(epoch)
        runs.append(s.epoch_batches())
    assert runs[0] == runs[1]
    maxima = [max(lengths[i] for i in b) for b in runs[0]]
    assert maxima == sorted(maxima)
    assert sorted(i for b in runs[0] for i in b) == list(range(len(lengths)))
    # Several ranks: equal counts, all utterances, a repeated batch only to even out the remainder.
    for world in (2, 3, 7):
        per_rank = rank_lists(lengths, world, 0, is_training=False)
        assert len({len(b) for b in per_rank}) == 1
        assert {i for b in per_rank for bb in b for i in bb} == set(range(len(lengths)))
    # Fewer validation batches than ranks still gives each rank one.
    tiny = rank_lists([100] * 10, 4, 0, is_training=False)
    assert all(len(b) == 1 for b in tiny)


def test_funasr_batch_sampler_repeats_its_order_every_epoch() -> None:
    # The problem this sampler solves: a corpus smaller than sort_size x world size is one buffer,
    # sorted by length, and its batches come shortest first in every epoch.
    lengths = realistic_lengths(500)
    make = tables.batch_sampler_classes.get("BatchSampler")
    profiles = []
    for epoch in (0, 1, 2):
        s = make(Lengths(lengths), batch_type="token", batch_size=BATCH, sort_size=1024, shuffle=True,
                 max_token_length=5000)["batch_sampler"]
        s.set_epoch(epoch)
        batches = list(s)
        profiles.append([(len(b), max(lengths[i] for i in b)) for b in batches])
    assert profiles[0] == profiles[1] == profiles[2]
    assert [m for _, m in profiles[0]] == sorted(m for _, m in profiles[0])


def test_registered_entry_returns_funasr_dataloader_arguments() -> None:
    conf = {"batch_type": "token", "batch_size": BATCH, "sort_size": 1024, "shuffle": True,
            "num_workers": 1, "max_token_length": 5000, "index_ds": "IndexDSJsonl", "data_split_num": 1}
    ds = Lengths(realistic_lengths(500))
    ours = tables.batch_sampler_classes.get("LengthBucketBatchSampler")(ds, start_step=0, **conf)
    theirs = tables.batch_sampler_classes.get("BatchSampler")(ds, start_step=0, **conf)
    assert set(ours) == set(theirs)
    assert {k: v for k, v in ours.items() if k != "batch_sampler"} == \
        {k: v for k, v in theirs.items() if k != "batch_sampler"}
    assert tables.batch_sampler_classes.get("LengthBucketBatchSampler") is length_bucket_batch_sampler


def test_one_epoch_through_funasr_dataloader_map_style() -> None:
    conf = {"batch_sampler": "LengthBucketBatchSampler", "batch_type": "token", "batch_size": BATCH,
            "shuffle": True, "num_workers": 0, "pin_memory": False, "seed": 3}
    loader = DataloaderMapStyle(dataset="TestBatchSamplerLengths", train_data_set_list="800",
                                valid_data_set_list="200", dataset_conf=conf)
    tr, val = loader.build_iter(epoch=2, start_step=2)
    expected = sampler(realistic_lengths(800), seed=3)
    expected.set_epoch(2)
    assert list(tr) == list(expected)[2:] and len(tr) == len(expected) - 2
    lengths = realistic_lengths(200)
    assert sorted(i for b in val for i in b) == list(range(200))
    assert [max(lengths[i] for i in b) for b in val] == sorted(max(lengths[i] for i in b) for b in val)


def test_cut_batches_is_greedy_along_the_given_order() -> None:
    lengths = np.array([10, 10, 30, 30, 30, 100])
    batches, over = cut_batches(np.arange(6), lengths, batch_size=90, batch_type="token", max_utts=200)
    # 30 x 3 = 90 fits; a fourth would make 120; 100 alone is over 90 and still gets its batch.
    assert batches == [[0, 1, 2], [3, 4], [5]] and over == 1
