"""Session fixtures for the end-to-end tests: stages 0-1 on a digit subset, and stage 2 runs on it.

``prepared``: a 400-utterance subset of the bundled digits (4 training speakers, held-out dev speaker)
through stages 0-1; ``trained``: stages 2-5 on it into ``prepared/exp_ds`` (16 epochs of tiny_sensevoice
from scratch with DeepSpeed ZeRO-1 bf16 on 2 CPU ranks); ``finetuned``: one epoch of
conf/sensevoice_small.yaml from ``trained``'s model dir, as a user fine-tunes iic/SenseVoiceSmall, into
``prepared/exp_ft``.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from funasr_recipe.reports.curves import parse_log
from tests.helpers.run_sh import run_sh
from tests.helpers.train_data import make_digit_subset

# Enough updates for the loss to move in a few epochs of 400 utterances.
FAST = ["++scheduler_conf.warmup_steps=10", "++train_conf.log_interval=2", "++dataset_conf.batch_size=3000"]
# Enough for the words, not only the tags: 16 epochs of 20 steps per rank reach a validation loss of 0.65
# and 24% WER on the 50 dev utterances (1 min 50 s of training on 2 cores); 4 epochs of FAST end near 3,
# with every digit still deleted.
LEARN = ["++train_conf.max_epoch=16", "++scheduler_conf.warmup_steps=30", "++train_conf.log_interval=2",
         "++dataset_conf.batch_size=1500"]


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("train")
    make_digit_subset(root / "kaldi")
    res = run_sh("--stop-stage", "1", "--corpus", "kaldi", "--corpus-dir", str(root / "kaldi"),
                 *dirs(root, "prep"))
    assert res.returncode == 0, res.stderr[-3000:]
    return root


def free_port() -> int:
    """A port nothing listens on now: a training run elsewhere on the machine may hold run.sh's 29500."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = str(free_port())


def dirs(root: Path, exp: str, dump: str = "dump") -> list[str]:
    """run.sh's folders under ``root`` (and a free rendezvous port)."""
    return ["--data-dir", str(root / "data"), "--dump-dir", str(root / dump), "--exp-dir", str(root / exp),
            "--master-port", PORT]


def train_stage2(prepared: Path, exp: str, epochs: int, *options: str) -> str:
    """Stage 2 alone into prepared/<exp> with run.sh ``options``; asserts success, returns train.log."""
    res = run_sh("--stage", "2", "--stop-stage", "2", *options, *dirs(prepared, exp), "--",
                 f"++train_conf.max_epoch={epochs}", *FAST, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return (prepared / exp / "train.log").read_text()


def val_losses(log: Path) -> list[float]:
    return parse_log(log).val_loss


@pytest.fixture(scope="session")
def trained(prepared: Path) -> Path:
    """Stages 2-5 in one run.sh: 16 epochs from scratch (DeepSpeed ZeRO-1 bf16, 2 CPU ranks), then
    averaging, decoding and scoring, ONNX export with parity, package and benchmark. run.sh's stderr
    is kept as ``run.stderr``."""
    exp = prepared / "exp_ds"
    res = run_sh("--stage", "2", "--stop-stage", "5", *dirs(prepared, "exp_ds"), "--", *LEARN, timeout=1500)
    assert res.returncode == 0, res.stderr[-4000:]
    (exp / "run.stderr").write_text(res.stderr)
    return exp


@pytest.fixture(scope="session")
def finetuned(prepared: Path, trained: Path) -> Path:
    """One epoch of conf/sensevoice_small.yaml from the tiny model's hub-format dir."""
    # Its own dump dir: stage 1 with another config would redo the shared one (a new fingerprint), and
    # with it every later stage 2 of the from-scratch runs.
    res = run_sh("--stage", "1", "--stop-stage", "2", "--config", "conf/sensevoice_small.yaml",
                 "--pretrained-dir", str(trained / "best_model"), *dirs(prepared, "exp_ft", "dump_ft"), "--",
                 "++train_conf.max_epoch=1", "++dataset_conf.num_workers=1", timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    (prepared / "exp_ft" / "stage2.stderr").write_text(res.stderr)
    return prepared / "exp_ft"
