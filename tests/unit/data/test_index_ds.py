"""IndexDSJsonlMmap (data/index_ds.py over data/line_index.py) against funasr's own IndexDSJsonl: the same
items, lengths, batches (the recipe's LengthBucketBatchSampler and funasr's BatchSampler) and replay
picks over a few hundred lines that funasr's filters partly drop, a list file of jsonl files, and bad
input (a broken line, a stale or foreign index, an empty list, a missing jsonl in a list).

Writes jsonl files and their indexes in tmp; no audio, no model.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from funasr.datasets.audio_datasets.datasets import AudioDataset
from funasr.datasets.audio_datasets.index_ds import IndexDSJsonlRankFull
from funasr.register import tables

import funasr_recipe.data.batch_sampler  # noqa: F401  (registers LengthBucketBatchSampler)
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data import line_index
from funasr_recipe.data.batch_sampler import BucketBatchSampler
from funasr_recipe.data.feats_dataset import FbankAudioDataset
from funasr_recipe.data.index_ds import NAME, IndexDSJsonlMmap
from funasr_recipe.data.line_index import build_index, load_index
from funasr_recipe.data.replay import write_train_list


def rows(n: int, seed: int, name: str = "set") -> list[dict]:
    """Stage-1 style lines with what funasr's index treats specially: lengths over its default limits,
    lines without a source, the "/cpfs01" and "aishell" sources, optional tags, separators in text."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        row = {"key": f"{name}-{i:04d}", "source": f"/dump/{name}/{i}.ark:{17 * i}",
               "source_len": int(rng.integers(1, 2600)), "target": f"word {i} and\u2028more",
               "target_len": int(rng.integers(0, 120))}
        if i % 13 == 0:
            row["source"] = f"/cpfs01/{name}/{i}.ark:0"
        if i % 17 == 0:
            row["source"] = f"/data/aishell/{name}/{i}.ark:0"
            row["text_language"] = "<|en|>" if i % 2 else "<|zh|>"
        if i % 5 == 0:
            row |= {"text_language": "<|en|>", "emo_target": "<|HAPPY|>", "event_target": "<|Speech|>",
                    "with_or_wo_itn": "<|woitn|>"}
        if i % 29 == 0:
            row["prompt"] = "<ASR2>"
        if i % 31 == 0:
            del row["source"]
        if i % 37 == 0:
            del row["source_len"], row["target_len"]
        out.append(row)
    return out


def write(path: Path, lines: list[dict], last_newline: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines)
    path.write_text(text if last_newline else text[:-1], encoding="utf-8")
    return path


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write(tmp_path / "dump" / "train" / "data.jsonl", rows(300, 0), last_newline=False)


LIMITS = [{}, {"max_source_length": 1500, "min_source_length": 40, "max_target_length": 90,
               "min_target_length": 3, "max_token_length": 1550}]


@pytest.mark.parametrize("conf", LIMITS)
def test_the_same_items_and_lengths_as_funasrs_index(data: Path, conf: dict) -> None:
    theirs, ours = IndexDSJsonlRankFull(str(data), **conf), IndexDSJsonlMmap(str(data), **conf)
    assert 100 < len(ours) < 300 and len(ours) == len(theirs)
    assert [ours[i] for i in range(len(ours))] == theirs.contents
    assert ours.source_lengths().tolist() == [theirs.get_source_len(x) for x in theirs.contents]
    assert [ours.target_len_at(i) for i in range(len(ours))] == [theirs.get_target_len(x)
                                                                 for x in theirs.contents]
    assert ours[-1] == theirs.contents[-1]
    with pytest.raises(IndexError):
        ours[len(ours)]


def test_a_list_file_is_read_and_sliced_as_funasr_does(tmp_path: Path) -> None:
    files = [write(tmp_path / f"part{k}.jsonl", rows(60 + k, k, f"p{k}")) for k in range(5)]
    listing = tmp_path / "train.list"
    listing.write_text("".join(f"{f}\n" for f in files))
    for conf in ({}, {"data_split_num": 2, "data_split_i": 1}, {"data_split_num": 2, "data_split_i": 1,
                                                               "is_training": False}):
        theirs, ours = IndexDSJsonlRankFull(str(listing), **conf), IndexDSJsonlMmap(str(listing), **conf)
        assert [ours[i] for i in range(len(ours))] == theirs.contents
        assert ours.source_lengths().tolist() == [x["source_len"] for x in theirs.contents]
    assert len(IndexDSJsonlMmap(str(listing), data_split_num=2, data_split_i=1).indexes) == 2


def datasets(path: Path, conf: dict) -> tuple[AudioDataset, FbankAudioDataset]:
    """funasr's dataset over its own index, and the recipe's over the mapped one (its fast paths)."""
    conf = {"batch_type": "token", **conf}
    return (AudioDataset(str(path), index_ds="IndexDSJsonl", **conf),
            FbankAudioDataset(str(path), index_ds=NAME, **conf))


@pytest.mark.parametrize("conf", LIMITS)
def test_the_same_batches_from_both_samplers_on_every_rank(data: Path, conf: dict) -> None:
    theirs, ours = datasets(data, conf)
    assert [ours.get_source_len(i) for i in range(len(ours))] == \
           [theirs.get_source_len(i) for i in range(len(theirs))]
    for epoch in (0, 1):
        for rank in (0, 1):
            kw = {"batch_size": 3000, "batch_type": "token", "seed": 5, "length_jitter": 0.1, "rank": rank,
                  "world_size": 2}
            a, b = BucketBatchSampler(theirs, **kw), BucketBatchSampler(ours, **kw)
            a.set_epoch(epoch)
            b.set_epoch(epoch)
            assert list(a) == list(b) and len(list(a)) > 3
            funasr_sampler = tables.batch_sampler_classes.get("BatchSampler")
            kw = {"batch_size": 3000, "batch_type": "token", "shuffle": True, "sort_size": 64}
            a = funasr_sampler(theirs, **kw)["batch_sampler"]
            b = funasr_sampler(ours, **kw)["batch_sampler"]
            a.set_epoch(epoch)
            b.set_epoch(epoch)
            assert list(a) == list(b) and len(list(a)) > 3


def test_the_same_replay_picks(tmp_path: Path) -> None:
    def sourced(n: int, seed: int, name: str) -> list[dict]:  # replay's lists all have sources
        return [r for r in rows(n, seed, name) if "source" in r]

    new = write(tmp_path / "dump" / "train" / "data.jsonl", sourced(80, 1, "new"))
    pool = write(tmp_path / "dump" / "replay" / "data.jsonl", sourced(200, 2, "old"))
    train_list = tmp_path / "exp" / "train_replay.jsonl"
    write_train_list(new, [pool], train_list)
    theirs, ours = datasets(train_list, {"max_source_length": 2000})
    kw = {"batch_size": 3000, "batch_type": "token", "seed": 3, "replay_list": [str(pool)],
          "replay_ratio": 0.5, "rank": 0, "world_size": 1}
    a, b = BucketBatchSampler(theirs, **kw), BucketBatchSampler(ours, **kw)
    assert a.selector.is_replay.tolist() == b.selector.is_replay.tolist()
    for epoch in (0, 3):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        assert list(a) == list(b)


def test_the_index_is_shared_and_costs_nothing_per_unfiltered_line(data: Path, tmp_path: Path) -> None:
    every = write(tmp_path / "every.jsonl", [r for r in rows(300, 4) if "source" in r])
    ours = IndexDSJsonlMmap(str(every), max_source_length=10**6, max_token_length=10**6)
    assert ours.kept == [None]  # every line is an item: no array of its own
    lengths = ours.source_lengths()
    assert not lengths.flags.writeable and lengths.base is not None  # a view of the read-only mapping
    filtered = IndexDSJsonlMmap(str(data))
    assert filtered.kept[0].dtype == np.int32
    # A spawned worker maps the file again: the pickle carries paths, not arrays.
    again = pickle.loads(pickle.dumps(filtered))
    assert len(pickle.dumps(filtered)) < 2000 and [again[i] for i in range(20)] == [filtered[i]
                                                                                 for i in range(20)]


def test_a_rebuild_writes_the_same_bytes_and_a_valid_index_is_not_rebuilt(data: Path, caplog) -> None:
    first = build_index(data).read_bytes()
    os.utime(data, ns=(1, 1))
    assert build_index(data).read_bytes() == first  # no mtime or path in it
    caplog.set_level(logging.INFO)
    caplog.clear()
    load_index(data)
    assert "indexed" not in caplog.text and "rebuilding" not in caplog.text


@pytest.mark.parametrize("change", ["a length near the head", "a length in the middle", "lines added",
                                    "older index", "foreign"])
def test_a_stale_or_foreign_index_is_rebuilt_never_trusted(tmp_path: Path, change: str, caplog) -> None:
    # 3000 lines: more than the 64 KiB at each end whose sha1 the index records.
    data = write(tmp_path / "data.jsonl", [r for r in rows(3000, 8) if "source_len" in r])
    index = build_index(data)
    if change.startswith("a length"):
        # One digit of a source_len: the same size and offsets, only the numbers differ; in the middle,
        # on a line the check re-reads, as the head's sha1 does not reach it.
        n = len(load_index(data))
        lineno = 2 if "head" in change else 1 + int(np.linspace(0, n - 1, line_index.SAMPLES)[15])
        old = f'"source_len": {json.loads(data.read_text().split(chr(10))[lineno - 1])["source_len"]},'
        lines = data.read_text(encoding="utf-8").split("\n")
        lines[lineno - 1] = lines[lineno - 1].replace(old, old[:-2] + str((int(old[-2]) + 1) % 10) + ",")
        data.write_text("\n".join(lines), encoding="utf-8")
        os.utime(index, ns=(os.stat(data).st_mtime_ns,) * 2)  # as if in the same clock tick
        assert os.path.getsize(data) > 2 * line_index.EDGE
    elif change == "lines added":
        with open(data, "a", encoding="utf-8") as f:
            f.write(json.dumps({"key": "x", "source": "a:1", "source_len": 5, "target": "A"}) + "\n")
    elif change == "older index":
        os.utime(index, ns=(os.stat(data).st_mtime_ns - 10**9,) * 2)
    else:
        index.write_bytes(b"not an index at all")
    caplog.set_level(logging.INFO)
    ours = IndexDSJsonlMmap(str(data), max_source_length=10**6, max_token_length=10**6)
    assert "rebuilding" in caplog.text
    theirs = IndexDSJsonlRankFull(str(data), max_source_length=10**6, max_token_length=10**6)
    assert [ours[i] for i in range(len(ours))] == theirs.contents
    assert ours.source_lengths().tolist() == [x["source_len"] for x in theirs.contents]


def test_bad_input_is_named_by_file_and_line(tmp_path: Path) -> None:
    good = write(tmp_path / "good.jsonl", rows(20, 5))
    broken = tmp_path / "broken.jsonl"
    broken.write_text(good.read_text() + '{"key": "cut", "source": "a.ark:1", "sour\n')
    with pytest.raises(BadInputError, match=rf"{broken}:21: not JSON"):
        IndexDSJsonlMmap(str(broken))
    bad_len = write(tmp_path / "len.jsonl", [{"key": "u1", "source": "a:1", "target": "A",
                                              "source_len": 2.5}])
    with pytest.raises(BadInputError, match=rf"{bad_len}:1: u1: source_len 2.5 is not an integer"):
        IndexDSJsonlMmap(str(bad_len))
    text = write(tmp_path / "text.jsonl", [{"key": "t1", "text": "hello"}])
    with pytest.raises(BadInputError, match=rf"{text}:1: t1: a \"text\" field"):
        IndexDSJsonlMmap(str(text))
    empty = tmp_path / "empty.list"
    empty.write_text("\n\n")
    with pytest.raises(BadInputError, match="names no jsonl file"):
        IndexDSJsonlMmap(str(empty))
    listing = tmp_path / "train.list"
    listing.write_text(f"{good}\n{tmp_path / 'gone.jsonl'}\n")
    with pytest.raises(BadInputError, match=rf"{listing}:2: {tmp_path / 'gone.jsonl'} is not a file"):
        IndexDSJsonlMmap(str(listing))
    with pytest.raises(BadInputError, match="max_token_length must be a number"):
        IndexDSJsonlMmap(str(good), max_token_length=None)


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    lines = rows(10, 6)
    path = tmp_path / "blank.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines[:5]) + "\n\n  \n" +
                    "\n".join(json.dumps(r) for r in lines[5:]) + "\n")
    ours = IndexDSJsonlMmap(str(path), max_source_length=10**6, max_token_length=10**6)
    theirs = IndexDSJsonlRankFull(str(write(tmp_path / "plain.jsonl", lines)), max_source_length=10**6,
                                  max_token_length=10**6)
    assert [ours[i] for i in range(len(ours))] == theirs.contents


def test_an_unwritable_folder_gets_its_index_in_the_cache(data: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(line_index.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(line_index.os, "access", lambda path, mode: False)
    ours = IndexDSJsonlMmap(str(data))
    assert not (data.parent / "data.jsonl.idx").exists()
    assert ours.indexes[0].path.parent == tmp_path / "cache" and ours.indexes[0].path.is_file()
    assert len(ours) == len(IndexDSJsonlRankFull(str(data)))


def _load_and_count(jsonl: str, queue: multiprocessing.Queue) -> None:
    built = []
    original = line_index.build_index
    line_index.build_index = lambda *a: built.append(1) or original(*a)
    queue.put((len(load_index(Path(jsonl))), len(built)))


def test_processes_starting_together_build_it_once(tmp_path: Path) -> None:
    big = write(tmp_path / "big.jsonl", rows(20000, 7))
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_load_and_count, args=(str(big), queue)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [n for n, _ in results] == [20000] * 4
    assert sum(b for _, b in results) == 1
