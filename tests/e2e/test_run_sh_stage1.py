"""run.sh stage 1 on the bundled corpus: artifacts, rerun, and two nodes sharing the work."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.helpers.run_sh import CLEAN_ENV, ROOT, run_sh


def dirs(tmp: Path) -> list[str]:
    return ["--data-dir", str(tmp / "data"), "--dump-dir", str(tmp / "dump"), "--exp-dir", str(tmp / "exp")]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_stages_0_1_write_features_cmvn_and_tokenizer_then_skip(tmp_path: Path) -> None:
    res = run_sh("--stage", "0", "--stop-stage", "1", *dirs(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    dump = tmp_path / "dump"
    n_train = len((tmp_path / "data" / "train" / "data.jsonl").read_text().splitlines())
    n_dev = len((tmp_path / "data" / "dev" / "data.jsonl").read_text().splitlines())
    train, dev = lines(dump / "train" / "data.jsonl"), lines(dump / "dev" / "data.jsonl")
    assert len(train) == 3 * n_train and len(dev) == n_dev  # default speed perturbation 0.9/1.0/1.1
    assert sorted({i["speed"] for i in train}) == [0.9, 1.0, 1.1]
    assert (dump / "train" / "am.mvn").read_text().startswith("<Nnet>")
    assert (dump / "tokenizer" / "tiny_sensevoice" / "chn_jpn_yue_eng_ko_spectok.bpe.model").is_file()
    assert (dump / ".done").is_file() and "Stage 1: fbank features" in res.stderr
    assert "fbank: " in res.stderr and "utt/s" in res.stderr  # progress of rank 0 on the terminal
    replay = (tmp_path / "exp" / "replay.sh").read_text()
    assert "--stage 1 --stop-stage 1" in replay

    res = run_sh("--stage", "1", "--stop-stage", "1", *dirs(tmp_path))
    assert res.returncode == 0 and "dump is done; skipping" in res.stderr

    # Another speed perturbation redoes the training set only: dev's shards are kept.
    dev_ark = next((dump / "dev" / "shards").glob("*.ark"))
    before = dev_ark.stat().st_mtime_ns
    res = run_sh("--stage", "1", "--stop-stage", "1", "--speed-perturb", "1.0", *dirs(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(lines(dump / "train" / "data.jsonl")) == n_train
    assert dev_ark.stat().st_mtime_ns == before


def test_two_nodes_share_the_shards_and_node0_merges(tmp_path: Path) -> None:
    """Two run.sh processes as nodes 0 and 1 (one feature process each) over 127.0.0.1."""
    common = ["--stop-stage", "1", "--nnodes", "2", "--nj", "1", "--speed-perturb", "1.0",
              "--shard-size", "200", "--wait-timeout", "300", *dirs(tmp_path)]
    node1 = subprocess.Popen(["./run.sh", *common, "--node-rank", "1"], cwd=ROOT, env=CLEAN_ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    node0 = run_sh(*common, "--node-rank", "0")
    _, err1 = node1.communicate(timeout=300)
    assert node0.returncode == 0, node0.stderr[-3000:]
    assert node1.returncode == 0, err1[-3000:]
    logs = {p.name: p.read_text() for p in (tmp_path / "dump" / "log").glob("fbank.*.log")}
    assert set(logs) == {"fbank.0.log", "fbank.1.log"}
    assert "[node1 rank1]" in logs["fbank.1.log"] and "rank 1 of 2" in logs["fbank.1.log"]
    assert "waiting for node 0 to finish stage 1" in err1 or "dump is done" in err1
    shards = sorted((tmp_path / "dump" / "train" / "shards").glob("*.done"))
    assert len(shards) == 10  # 2000 utterances / 200
    n_train = len((tmp_path / "data" / "train" / "data.jsonl").read_text().splitlines())
    assert len(lines(tmp_path / "dump" / "train" / "data.jsonl")) == n_train
