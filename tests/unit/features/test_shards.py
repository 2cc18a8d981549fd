"""Stage 1's shards: a set of a few hundred utterances gives every process work; a large set keeps shards of
``--shard-size`` whatever the number of processes (dist/slicing.py ``shard_size_for``, features/dump.py).

  .venv/bin/python -m pytest tests/unit/features/test_shards.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from funasr_recipe.dist.slicing import my_shards, shard_size_for
from funasr_recipe.features.dump import SetPlan, plan_sets, shard_lines
from funasr_recipe.features.fbank_conf import FbankConf


def test_a_small_set_is_cut_into_one_shard_per_process_and_a_large_one_keeps_the_size() -> None:
    assert shard_size_for(500, 1000, 2) == 250  # the demo's dev set on 2 processes
    assert shard_size_for(801, 1000, 2) == 401
    assert shard_size_for(6000, 1000, 2) == 1000  # the demo's training set (3 speeds)
    assert shard_size_for(6000, 1000, 16) == 375  # 2 nodes x 8: 16 shards, not 6 and 10 idle ranks
    assert shard_size_for(10**6, 1000, 64) == 1000
    assert shard_size_for(3, 1000, 8) == 1 and shard_size_for(0, 1000, 2) == 1
    with pytest.raises(ValueError):
        shard_size_for(10, 0, 2)


def write_jsonl(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True)
    path.write_text("".join(f'{{"key": "u{i:04d}", "source": "/x/{i}.wav"}}\n' for i in range(n)))


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_every_rank_gets_shards_of_a_set_of_a_few_hundred(tmp_path: Path, world: int) -> None:
    write_jsonl(tmp_path / "data" / "dev" / "data.jsonl", 800)
    write_jsonl(tmp_path / "data" / "train" / "data.jsonl", 2500)
    dev, train = plan_sets(tmp_path / "data", tmp_path / "dump", ["dev", "train"], "train", "0.9 1.0 1.1",
                           1000, FbankConf(), world)
    assert dev.n_shards == world and dev.shard_size * world >= dev.n_jobs == 800
    assert all(my_shards(dev.n_shards, rank, world) for rank in range(world))
    # 7500 training jobs: shards of 1000 while that leaves no rank idle (8 ranks: 8 shards of 938).
    assert train.shard_size == (1000 if world <= 7 else 938) and train.n_jobs == 7500
    assert all(my_shards(train.n_shards, rank, world) for rank in range(world))


def test_the_shards_of_a_small_set_depend_on_the_world_size_and_a_large_sets_do_not(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "data" / "dev" / "data.jsonl", 500)
    write_jsonl(tmp_path / "data" / "train" / "data.jsonl", 4000)

    def plans(world: int) -> dict[str, str]:
        sets = plan_sets(tmp_path / "data", tmp_path / "dump", ["dev", "train"], "train", "1.0", 1000,
                         FbankConf(), world)
        return {p.name: p.fingerprint for p in sets}

    one, two, four = plans(1), plans(2), plans(4)
    assert one["dev"] != two["dev"]  # 1 shard of 500, then 2 of 250: a rerun with other --nj redoes dev
    assert one["train"] == two["train"] == four["train"]  # 4000 jobs: shards of 1000 for up to 4 ranks


@pytest.mark.parametrize("factors", [(1.0,), (0.9, 1.0, 1.1)])
@pytest.mark.parametrize("size", [1, 2, 5, 7])
def test_shard_lines_gives_each_shard_its_lines_in_one_pass(tmp_path: Path, factors: tuple,
                                                             size: int) -> None:
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("".join(json.dumps({"key": f"u{i}"}) + "\n" for i in range(23)))
    plan = SetPlan("train", jsonl, tmp_path, 23, factors, size, "fp")
    for shards in (list(range(plan.n_shards)), list(range(1, plan.n_shards, 3)), [plan.n_shards - 1]):
        got = list(shard_lines(plan, shards))
        assert [s for s, _ in got] == shards
        for shard, lines in got:  # the lines one of whose jobs (line x speed) falls in the shard
            jobs = range(shard * size, min((shard + 1) * size, plan.n_jobs))
            expected = sorted({j // len(factors) for j in jobs})
            assert [(n, obj["key"]) for n, obj in lines] == [(i + 1, f"u{i}") for i in expected]
