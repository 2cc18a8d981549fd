"""Stage 2 end to end through run.sh on CPU: funasr's trainer, torchrun, 2 ranks, real digit speech.

A 400-utterance subset (4 speakers) with a held-out speaker as dev keeps each run to about a minute;
stages 0-1 run once for the module and every test trains into its own exp dir.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.run_sh import CLEAN_ENV, ROOT, run_sh
from tests.helpers.train_fixtures import FAST, LEARN, dirs, train_stage2, val_losses

pytestmark = pytest.mark.slow
def test_deepspeed_zero1_bf16_two_ranks_learns_then_resumes(prepared: Path, trained: Path) -> None:
    exp = trained
    for name in ("config.yaml", "model.pt", "model.pt.ep16", "curves.png", "curves.tsv", ".train.done",
                 "best_model/model.pt", "best_model/configuration.json", "best_model/am.mvn"):
        assert (exp / name).exists(), name
    log = (exp / "train.log").read_text()
    assert "[node0 rank0]" in log and "[node0 rank1]" in log and "use_deepspeed: True" in log
    losses = val_losses(exp / "train.log")
    assert len(losses) == 16 and losses[-1] < 0.8 * losses[0], losses
    assert list((exp / "tensorboard").glob("events.*"))

    res = run_sh("--stage", "2", "--stop-stage", "2", *dirs(prepared, "exp_ds"), "--", *LEARN)
    assert res.returncode == 0 and "is trained; skipping" in res.stderr

    # One more epoch: funasr resumes from exp/model.pt at epoch 16 with its step count.
    more = [o for o in LEARN if not o.startswith("++train_conf.max_epoch=")] + ["++train_conf.max_epoch=17"]
    res = run_sh("--stage", "2", "--stop-stage", "2", *dirs(prepared, "exp_ds"), "--", *more, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert (exp / "model.pt.ep17").exists() and len(val_losses(exp / "train.log")) == 17
    assert "Train epoch: 16, rank: 0" in res.stderr and "Train epoch: 0, rank: 0" not in res.stderr


def test_finetune_from_a_model_dir_like_sensevoicesmall(trained: Path, finetuned: Path) -> None:
    """The command a user runs for iic/SenseVoiceSmall, with the tiny model's hub-format dir instead."""
    first_from_scratch = val_losses(trained / "train.log")[0]
    stderr = (finetuned / "stage2.stderr").read_text()
    log = (finetuned / "train.log").read_text()
    # Named by what it is (model/provenance.py), not by the config it is fine-tuned with (sensevoice_small).
    assert f"fine-tuning {(trained / 'best_model').resolve()} (tiny_sensevoice.yaml from scratch, best " \
        "checkpoint)" in stderr
    assert "status: <All keys matched successfully>" in log  # funasr loaded every pretrained weight
    first_finetuned = val_losses(finetuned / "train.log")[0]
    assert first_finetuned < 0.5 * first_from_scratch, (first_finetuned, first_from_scratch)
    assert "training keeps the pretrained model's own am.mvn" in stderr


def test_ddp_engine(prepared: Path) -> None:
    log = train_stage2(prepared, "exp_ddp", 2, "--train-engine", "ddp")
    assert "use_ddp: True" in log and "[node0 rank1]" in log
    assert len(val_losses(prepared / "exp_ddp" / "train.log")) == 2


def test_missing_node_is_named(prepared: Path) -> None:
    res = run_sh("--stage", "2", "--stop-stage", "2", "--nnodes", "3", "--node-rank", "0",
                 "--wait-timeout", "2", *dirs(prepared, "exp_missing"))
    assert res.returncode == 1
    assert "node(s) 1 2 of 3 have not arrived" in res.stderr and "--node-rank 1 2" in res.stderr
    assert not (prepared / "exp_missing" / ".nodes" / "node0").exists()  # checked out again on exit


def last_step(log: Path) -> int:
    return max(int(s) for s in re.findall(r"train, rank: 0, .*?total step: (\d+)", log.read_text()))


def test_rank_killed_mid_epoch_resumes_to_the_same_number_of_steps(prepared: Path) -> None:
    """kill -9 of one rank after a mid-epoch checkpoint; the rerun ends where an uninterrupted run ends."""
    over = ["--", "++train_conf.max_epoch=2", "++train_conf.save_checkpoint_interval=3",
            "++train_conf.log_interval=1", "++scheduler_conf.warmup_steps=10",
            "++dataset_conf.batch_size=3000"]
    ref = run_sh("--stage", "2", "--stop-stage", "2", *dirs(prepared, "exp_ref"), *over, timeout=900)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = last_step(prepared / "exp_ref" / "train.log")

    args = ["./run.sh", "--stage", "2", "--stop-stage", "2", *dirs(prepared, "exp_kill"), *over]
    # stderr into a file, not a pipe: nothing reads a pipe while the loop below waits, and once its 64 KiB
    # are full run.sh blocks on writing its log (and training with it).
    stderr = prepared / "exp_kill.stderr"
    with open(stderr, "w") as err_file:
        run = subprocess.Popen(args, cwd=ROOT, env=CLEAN_ENV, stdout=subprocess.DEVNULL, stderr=err_file,
                               text=True)
    log = prepared / "exp_kill" / "train.log"
    deadline = time.monotonic() + 600
    while not (log.exists() and re.search(r"train, rank: 0, .*total step: 5,", log.read_text())):
        assert run.poll() is None and time.monotonic() < deadline, "training ended before step 5"
        time.sleep(0.5)
    torchrun = subprocess.run(["pgrep", "-f", f"torchrun.*{prepared / 'exp_kill'}"], capture_output=True,
                              text=True).stdout.split()
    # Its children that are ranks: run.sh's tee of the log is torchrun's child too (the process
    # substitution is made before the exec).
    ranks = subprocess.run(["pgrep", "-P", torchrun[0], "-f", "local.train"], capture_output=True,
                           text=True).stdout.split()
    assert len(ranks) == 2, ranks
    os.kill(int(ranks[-1]), signal.SIGKILL)
    run.wait(timeout=300)
    err = stderr.read_text()
    assert run.returncode != 0 and "training failed" in err
    assert (prepared / "exp_kill" / "model.pt.ep0.3").exists()  # the mid-epoch checkpoint it resumes from

    res = run_sh(*args[1:], timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert last_step(log) == want, (last_step(log), want)
    assert "Checkpoint loaded successfully" in res.stderr


@pytest.mark.parametrize("config", ["tiny_paraformer", "tiny_conformer_ctc"])
def test_other_tiny_configs_learn(prepared: Path, config: str) -> None:
    """Stages 1-2 with each from-scratch config (its own tokenizer and LFR), DeepSpeed, 2 ranks."""
    res = run_sh("--stage", "1", "--stop-stage", "2", "--config", f"conf/{config}.yaml",
                 "--data-dir", str(prepared / "data"), "--dump-dir", str(prepared / f"dump_{config}"),
                 "--exp-dir", str(prepared / f"exp_{config}"), "--speed-perturb", "1.0", "--",
                 "++train_conf.max_epoch=4", *FAST, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    losses = val_losses(prepared / f"exp_{config}" / "train.log")
    assert len(losses) == 4 and min(losses[1:]) < 0.8 * losses[0], losses
    assert (prepared / f"dump_{config}" / "tokenizer" / config / "tokenizer.model").is_file()


def test_offline_hub_name_stops_with_the_download_command(prepared: Path, tmp_path: Path) -> None:
    env = {"MODELSCOPE_CACHE": str(tmp_path)}  # an empty cache; CI cannot reach the hub
    res = run_sh("--stage", "2", "--stop-stage", "2", "--config", "conf/sensevoice_small.yaml",
                 *dirs(prepared, "exp_offline"), env=env, timeout=120)
    if "downloading from ModelScope" in res.stderr:
        pytest.skip("this machine reaches ModelScope")
    assert res.returncode == 1
    assert "modelscope download --model iic/SenseVoiceSmall" in res.stderr
    assert "--pretrained-dir" in res.stderr


def test_raw_audio_path_trains_too(prepared: Path) -> None:
    """--feats-type raw: funasr's own dataset decodes the audio every step (for comparison), from stage 1's
    raw.jsonl: stage 0's audio entries with the targets normalised as for the features."""
    log = train_stage2(prepared, "exp_raw", 1, "--feats-type", "raw")
    assert "'dataset': 'SenseVoiceCTCDataset'" in log and "/dump/train/raw.jsonl" in log
    assert len(val_losses(prepared / "exp_raw" / "train.log")) == 1
