"""Replay (data/replay.py, data/batch_sampler.py): the training list, the per-epoch draw, ranks, validation.

Writes small data.jsonl files in tmp and reads them back through funasr's own IndexDSJsonl (which drops
lines outside its length limits, so dataset indices are not line numbers); ranks are simulated with the
sampler's explicit rank/world_size arguments. No audio, no model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from funasr.datasets.audio_datasets.index_ds import IndexDSJsonlRankFull
from funasr.datasets.dataloader_entry import DataloaderMapStyle
from funasr.register import tables

from funasr_recipe.data.batch_sampler import BucketBatchSampler, length_bucket_batch_sampler
from funasr_recipe.data.replay import ReplaySelector, write_train_list


def write_set(path: Path, name: str, n: int, lengths: list[int] | None = None) -> Path:
    """A stage-1 style data.jsonl of ``n`` lines whose sources are <name>/<i>.ark:0."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(name) + n)
    lengths = lengths or rng.integers(50, 400, n).tolist()
    with open(path, "w", encoding="utf-8") as f:
        for i, n_frames in enumerate(lengths):
            f.write(json.dumps({"key": f"{name}-{i:04d}", "source": f"/dump/{name}/{i}.ark:0",
                                "source_len": int(n_frames), "target": "ONE", "target_len": 3}) + "\n")
    return path


class IndexedSet(torch.utils.data.Dataset):
    """What the sampler reads of funasr's datasets (index_ds, lengths), over funasr's own IndexDSJsonl."""

    def __init__(self, path: str, is_training: bool = True, **kwargs) -> None:
        self.index_ds = IndexDSJsonlRankFull(str(path), is_training=is_training, **kwargs)

    def __len__(self) -> int:
        return len(self.index_ds)

    def get_source_len(self, i: int) -> int:
        return self.index_ds.get_source_len(self.index_ds[i])

    def __getitem__(self, i: int) -> str:
        return self.index_ds[i]["source"]

    @staticmethod
    def collator(items: list[str]) -> list[str]:
        return items


@tables.register("dataset_classes", "TestReplayIndexedSet")
class RegisteredIndexedSet(IndexedSet):
    def __init__(self, path: str, frontend=None, tokenizer=None, is_training: bool = True, **kw) -> None:
        super().__init__(path, is_training=is_training, **kw)


@pytest.fixture
def lists(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(training list = 40 new + 200 replay lines, the new set, the replay pool)."""
    new = write_set(tmp_path / "dump" / "train" / "data.jsonl", "train", 40)
    pool = write_set(tmp_path / "dump" / "replay_zh" / "data.jsonl", "replay_zh", 200)
    out = tmp_path / "dump" / "train" / "train_replay.jsonl"
    write_train_list(new, [pool], out)
    return out, new, pool


def sampler(train_list: Path, pool: Path | list, rank: int = 0, world: int = 1,
            dataset_kw: dict | None = None, **kw) -> BucketBatchSampler:
    kw = {"batch_size": 2000, "batch_type": "token", "seed": 3, "replay_ratio": 1.0, **kw}
    return BucketBatchSampler(IndexedSet(str(train_list), **(dataset_kw or {})), rank=rank, world_size=world,
                              replay_list=pool, **kw)


def epoch_indices(s: BucketBatchSampler, epoch: int) -> list[int]:
    """Dataset indices of all ranks' batches of ``epoch``, sorted."""
    s.set_epoch(epoch)
    return sorted(i for b in s.epoch_batches() for i in b)


def replay_count(s: BucketBatchSampler, indices: list[int]) -> int:
    return int(s.selector.is_replay[np.asarray(indices, dtype=int)].sum())


def test_train_list_is_the_new_lines_then_each_pool_and_rewrites_identical_bytes(tmp_path: Path) -> None:
    new = write_set(tmp_path / "train.jsonl", "train", 5)
    pools = [write_set(tmp_path / "replay_a" / "data.jsonl", "a", 3),
             write_set(tmp_path / "replay_b" / "data.jsonl", "b", 4)]
    out = tmp_path / "list" / "train_replay.jsonl"
    counts = write_train_list(new, pools, out)
    assert (counts.new, counts.replay, list(counts.pools.values())) == (5, 7, [3, 4])
    keys = [json.loads(line)["key"] for line in out.read_text().splitlines()]
    expected = [json.loads(line)["key"] for p in (new, *pools) for line in p.read_text().splitlines()]
    assert keys == expected
    first = out.read_bytes()
    write_train_list(new, pools, out)  # another rank, same inputs
    assert out.read_bytes() == first
    assert [p.name for p in out.parent.iterdir()] == ["train_replay.jsonl"]  # no temporary left behind


def test_empty_pool_is_an_error_naming_the_file_and_stage_0_report(tmp_path: Path) -> None:
    new = write_set(tmp_path / "dump" / "train" / "data.jsonl", "train", 5)
    empty = tmp_path / "dump" / "replay_ja" / "data.jsonl"
    empty.parent.mkdir(parents=True)
    empty.write_text("\n")
    out = tmp_path / "dump" / "train" / "train_replay.jsonl"
    with pytest.raises(ValueError, match="no usable utterances") as e:
        write_train_list(new, [empty], out, data_dir=tmp_path / "data")
    assert str(empty) in str(e.value) and str(tmp_path / "data" / "replay_ja" / "report.json") in str(e.value)
    assert not out.exists() and list(out.parent.iterdir()) == [new]


def test_a_source_in_both_sets_is_refused(tmp_path: Path) -> None:
    new = write_set(tmp_path / "train.jsonl", "same", 5)
    pool = write_set(tmp_path / "replay_x" / "data.jsonl", "same", 3)  # the same sources as new's first 3
    with pytest.raises(ValueError, match="is in the training set"):
        write_train_list(new, [pool], tmp_path / "out.jsonl")


def test_draw_is_fixed_by_seed_and_epoch_and_changes_between_epochs() -> None:
    is_replay = np.r_[np.zeros(50, bool), np.ones(500, bool)]
    a, b = ReplaySelector(is_replay, 1.0, seed=7), ReplaySelector(is_replay, 1.0, seed=7)
    assert np.array_equal(a.epoch_indices(4), b.epoch_indices(4))
    assert not np.array_equal(a.epoch_indices(4), ReplaySelector(is_replay, 1.0, seed=8).epoch_indices(4))
    drawn = [set(a.epoch_indices(e)[50:].tolist()) for e in range(5)]
    assert all(len(d) == 50 for d in drawn)
    assert all(drawn[i] != drawn[j] for i in range(5) for j in range(i + 1, 5))
    # Over epochs the draw reaches well beyond one epoch's 50 (a fixed subset would stay at 50).
    assert len(set().union(*drawn)) > 150


@pytest.mark.parametrize("ratio", [0.5, 1.0, 3.0])
def test_each_epoch_holds_every_new_utterance_and_ratio_times_as_many_replay(
        lists: tuple[Path, Path, Path], ratio: float) -> None:
    train_list, _, pool = lists
    s = sampler(train_list, pool, replay_ratio=ratio)
    for epoch in (0, 1):
        picked = epoch_indices(s, epoch)
        new = [i for i in picked if not s.selector.is_replay[i]]
        assert sorted(new) == list(range(40))  # the new lines come first in the list
        assert replay_count(s, picked) == round(ratio * 40)
        replay = [i for i in picked if s.selector.is_replay[i]]
        assert len(set(replay)) == len(replay)  # 200 in the pool: no repeats needed


def test_ratio_zero_trains_on_the_new_utterances_alone(lists: tuple[Path, Path, Path]) -> None:
    train_list, _, pool = lists
    assert epoch_indices(sampler(train_list, pool, replay_ratio=0), 0) == list(range(40))


def test_every_rank_sees_the_same_epoch_list(lists: tuple[Path, Path, Path]) -> None:
    train_list, _, pool = lists
    ranks = [sampler(train_list, pool, rank=r, world=2) for r in range(2)]
    for epoch in (0, 5):
        for s in ranks:
            s.set_epoch(epoch)
        assert ranks[0].epoch_batches() == ranks[1].epoch_batches()
        mine = [sorted(i for b in s.rank_batches() for i in b) for s in ranks]
        assert sorted(mine[0] + mine[1]) == epoch_indices(ranks[0], epoch)
        assert len(ranks[0].rank_batches()) == len(ranks[1].rank_batches())


def test_a_pool_smaller_than_asked_is_used_whole_then_drawn(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    new = write_set(tmp_path / "train.jsonl", "train", 40)
    pool = write_set(tmp_path / "replay_s" / "data.jsonl", "small", 15)
    train_list = tmp_path / "list.jsonl"
    write_train_list(new, [pool], train_list)
    with caplog.at_level(logging.INFO):
        s = sampler(train_list, pool, replay_ratio=1.0)
        picked = epoch_indices(s, 2)
    replay = np.asarray([i for i in picked if s.selector.is_replay[i]])
    uses = np.bincount(replay - 40, minlength=15)
    assert len(replay) == 40 and sorted(set(uses.tolist())) == [2, 3]  # 40 = 2 x 15 + 10 drawn
    assert (uses == 3).sum() == 10
    assert "the replay pool holds 15 utterances" in caplog.text
    assert "epoch 2: 40 new + 40 replay utterances (ratio 1)" in caplog.text


def test_validation_ignores_replay(lists: tuple[Path, Path, Path]) -> None:
    train_list, _, pool = lists
    s = sampler(train_list, pool, is_training=False)
    assert s.selector is None
    assert epoch_indices(s, 0) == list(range(240))  # every line once, replay lines included


def test_replay_is_matched_by_source_when_funasr_drops_lines(tmp_path: Path) -> None:
    """IndexDSJsonl drops lines outside max_source_length: indices shift, sources still mark replay."""
    new = write_set(tmp_path / "train.jsonl", "train", 30, [100, 900] * 15)
    pool = write_set(tmp_path / "replay_z" / "data.jsonl", "replay_z", 30, [900, 120, 130] * 10)
    train_list = tmp_path / "list.jsonl"
    write_train_list(new, [pool], train_list)
    s = sampler(train_list, pool, dataset_kw={"max_source_length": 500}, replay_ratio=1.0)
    assert len(s.lengths) == 15 + 20  # funasr dropped every 900-frame line
    kept = IndexedSet(str(train_list), max_source_length=500).index_ds
    sources = [kept[i]["source"] for i in range(len(kept))]
    assert s.selector.is_replay.tolist() == ["replay_z" in src for src in sources]
    picked = epoch_indices(s, 0)
    assert replay_count(s, picked) == 15 and len(picked) == 30


def test_a_replay_list_matching_nothing_and_bad_ratios_are_errors(lists: tuple[Path, Path, Path],
                                                                  tmp_path: Path) -> None:
    train_list, _, _ = lists
    other = write_set(tmp_path / "other.jsonl", "elsewhere", 5)
    with pytest.raises(ValueError, match="none of the 5 replay sources"):
        sampler(train_list, other)
    with pytest.raises(ValueError, match="replay ratio"):
        ReplaySelector(np.ones(3, bool), -1.0)


def test_funasr_dataloader_passes_replay_to_training_only(lists: tuple[Path, Path, Path],
                                                          tmp_path: Path) -> None:
    """Through funasr's DataloaderMapStyle: dataset_conf reaches both samplers, only training replays."""
    train_list, _, pool = lists
    conf = {"batch_sampler": "LengthBucketBatchSampler", "batch_type": "token", "batch_size": 2000,
            "num_workers": 0, "pin_memory": False, "replay_list": [str(pool)], "replay_ratio": 0.5, "rank": 0,
            "world_size": 1}
    loaders = DataloaderMapStyle(dataset="TestReplayIndexedSet", train_data_set_list=str(train_list),
                                 valid_data_set_list=str(train_list), dataset_conf=conf)
    tr, val = loaders.build_iter(epoch=1)
    train_sources = [src for batch in tr for src in batch]
    assert sum("replay_zh" in src for src in train_sources) == 20 and len(train_sources) == 60
    assert len([src for batch in val for src in batch]) == 240
    # The registered entry point reads the same keys.
    args = length_bucket_batch_sampler(IndexedSet(str(train_list)), **conf)
    assert args["batch_sampler"].selector.ratio == 0.5
