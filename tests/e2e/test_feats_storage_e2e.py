"""``++feats_storage=uint16`` through run.sh: stage 1 writes Kaldi's 2-byte compressed matrices, stage 2
trains on them (DeepSpeed ZeRO-1 bf16, 2 CPU ranks) and stage 3 averages, decodes and scores.

The features' precision is bench_seeds' question (docs/scale_storage.md); this test asks that the whole
path runs on the half-size dump: two epochs of the tiny model on the 400-utterance digit subset, whose
training and validation batches are read from the CM2 shards (stage 3 decodes the audio itself, as a
deployed model does: the model trained on the half-size features meets exact ones there).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.run_sh import run_sh
from tests.helpers.train_fixtures import FAST, dirs, val_losses

pytestmark = pytest.mark.slow


def test_a_uint16_dump_trains_and_decodes(prepared: Path) -> None:
    res = run_sh("--stage", "1", "--stop-stage", "3", *dirs(prepared, "exp_u16", "dump_u16"),
                 "--speed-perturb", "1.0", "--", "++feats_storage=uint16", "++train_conf.max_epoch=2", *FAST,
                 timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    report = json.loads((prepared / "dump_u16" / "train" / "report.json").read_text())
    assert report["storage"] == "uint16" and report["accepted"] > 0
    line = json.loads((prepared / "dump_u16" / "train" / "data.jsonl").read_text().splitlines()[0])
    path, offset = line["source"].rsplit(":", 1)
    with open(path, "rb") as f:
        f.seek(int(offset))
        assert f.read(5) == b"\0BCM2"
    losses = val_losses(prepared / "exp_u16" / "train.log")
    assert len(losses) == 2 and losses[1] < losses[0], losses
    result = json.loads((prepared / "exp_u16" / "decode_dev" / "result.json").read_text())
    assert result["utterances"] > 0 and not result["missing_hyp"]
