"""Atomic checkpoints (funasr_recipe/compat/checkpoint_io.py): real 2-rank DeepSpeed ZeRO-1 bf16 CPU
trainings killed (SIGKILL, FUNASR_RECIPE_CKPT_KILL) in the middle of epoch 2's write, then resumed; the
same kill on funasr's own writes; funasr's DDP-path writes in a real Trainer; the pieces as units."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from funasr_recipe.compat.checkpoint_io import KILL_ENV, Kill, check_kept, recover, swap_in
from funasr_recipe.model.averaging import average
from funasr_recipe.model.checkpoint import deepspeed_safe_globals
from tests.helpers.run_sh import CLEAN_ENV, ROOT
from tests.helpers.train_fixtures import free_port

RANKS_ENV = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
             "PYTHONUNBUFFERED": "1", "LC_ALL": "C.UTF-8"}
# local/train.py under torchrun, with checkpoint_io installed first: install() is once per process, so
# local/train.py's own install() keeps this choice (atomic=False is funasr's own writes with only the
# fault injection: what a kill does without the module).
DRIVER = """import sys
from funasr_recipe.compat import checkpoint_io
checkpoint_io.install(atomic={atomic})
import local.train
sys.exit(local.train.main(sys.argv[1:]))
"""


def train(corpus: Path, exp: Path, epochs: int, kill: str = "", atomic: bool = True,
          overrides: tuple[str, ...] = ()) -> tuple[int, str]:
    """Stage 2's program on 2 CPU ranks as run.sh starts it (DeepSpeed ZeRO-1 bf16); (status, log)."""
    driver = exp.parent / f"driver_{atomic}.py"
    driver.write_text(DRIVER.format(atomic=atomic))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port()), str(driver), "--config", "conf/tiny_sensevoice.yaml", "--exp-dir", str(exp),
           "--data-dir", str(corpus / "data"), "--dump-dir", str(corpus / "dump"), "--train-set", "train",
           "--valid-set", "dev", "--oom-probe", "false", "--", f"++train_conf.max_epoch={epochs}",
           f"++tokenizer_conf.bpemodel={next((corpus / 'dump' / 'tok').glob('*.bpe.model'))}",
           "++dataset_conf.batch_size=3000", *overrides]
    env = {**CLEAN_ENV, **RANKS_ENV, KILL_ENV: kill}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    return res.returncode, res.stdout + res.stderr


def states(tag_dir: Path) -> dict:
    return torch.load(tag_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=True)


def assert_whole(tag_dir: Path) -> None:
    """Every file of a DeepSpeed tag dir loads: the model states and both ranks' ZeRO shards."""
    names = sorted(p.name for p in tag_dir.iterdir())
    assert names == ["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                     "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt"], names
    with torch.serialization.safe_globals(deepspeed_safe_globals()):
        for p in tag_dir.iterdir():
            torch.load(p, map_location="cpu", weights_only=True)


@pytest.mark.fault_slow
@pytest.mark.fault("kill -9 of rank 0 in the middle of writing epoch 2's checkpoint, then a rerun")
def test_a_kill_during_epoch_2s_write_resumes_from_epoch_1(dumped: Path, tmp_path: Path, lost) -> None:
    corpus, exp = dumped.parent, tmp_path / "exp"
    rc, log = train(corpus, exp, 2, kill="model.pt:2:0")
    half = exp / ".tmp.model.pt" / "mp_rank_00_model_states.pt"
    assert rc != 0 and f"killing rank 0 with {half} half written" in log, log[-3000:]
    assert (exp / ".tmp.model.pt").is_dir()  # the interrupted write
    assert_whole(exp / "model.pt")
    assert states(exp / "model.pt")["epoch"] == 1

    rc, log = train(corpus, exp, 2)
    assert rc == 0, log[-3000:]
    assert f"removed {exp}/.tmp.model.pt: a checkpoint write that never finished" in log
    assert f"Checkpoint loaded successfully from '{exp}/model.pt'" in log
    assert (exp / "train_skipped.tsv").read_text() == "set\tkey\treason\tdetail\n"  # none left out
    assert not [p for p in exp.iterdir() if p.name.startswith((".tmp.", ".old."))]
    state = states(exp / "model.pt")
    assert state["epoch"] == 2 and (exp / "latest").read_text() == "model.pt"
    # The bookkeeping after the resume: every kept checkpoint on disk, the best the lowest loss, and
    # model.pt.best a copy of it.
    saved = state["saved_ckpts"]
    assert set(saved) == {"model.pt.ep1", "model.pt.ep2"} and all((exp / n).is_dir() for n in saved)
    assert state["best_step_or_epoch"] == min(saved, key=saved.get)
    best, source = states(exp / "model.pt.best"), states(exp / state["best_step_or_epoch"])
    assert best["best_step_or_epoch"] == state["best_step_or_epoch"]
    assert all(torch.equal(best["module"][k], source["module"][k]) for k in source["module"])
    for name in ("model.pt", "model.pt.best", "model.pt.ep1", "model.pt.ep2"):
        assert_whole(exp / name)
    # Stage 3 reads the fp32 masters through DeepSpeed's zero_to_fp32, weights-only.
    assert average(exp, 2)[1] == sorted(saved, key=saved.get)
    lost("epoch 2's half-written checkpoint (a temporary, removed on the rerun); the rerun resumed from "
         "epoch 1's and finished")


@pytest.mark.fault_slow
@pytest.mark.fault("kill -9 of rank 1 in the middle of writing its checkpoint shard")
def test_a_kill_of_the_other_rank_leaves_the_last_checkpoint(dumped: Path, tmp_path: Path, lost) -> None:
    """Rank 1 dies writing its ZeRO shard; rank 0 has written its own files and waits at the barrier, so
    model.pt is never renamed over. (The same run checks train_skipped.tsv against what funasr's index
    kept: with max_token_length 60 it leaves out the longest digits.)"""
    exp = tmp_path / "exp"
    rc, log = train(dumped.parent, exp, 2, kill="model.pt:2:1",
                    overrides=("++dataset_conf.max_token_length=60",))
    assert rc != 0 and "killing rank 1 with" in log, log[-3000:]
    assert (exp / ".tmp.model.pt" / "mp_rank_00_model_states.pt").is_file()  # rank 0's part was done
    assert_whole(exp / "model.pt")
    assert states(exp / "model.pt")["epoch"] == 1

    rows = {s: [json.loads(line) for line in (dumped / s / "data.jsonl").read_text().splitlines()]
            for s in ("train", "dev")}
    long = {(role, r["key"]) for role, s in (("train", "train"), ("valid", "dev")) for r in rows[s]
            if r["source_len"] + r["target_len"] > 60}
    table = (exp / "train_skipped.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert {tuple(line.split("\t")[:2]) for line in table} == long and len(table) == len(long)
    n_train = sum(role == "train" for role, _ in long)
    assert f"stage 2 leaves out {len(long)} of 80 utterances (train {n_train} of 72" in log
    for s, role in (("train", "train"), ("dev", "valid")):
        kept = len(rows[s]) - sum(r == role for r, _ in long)
        assert f"total_num of samplers: {kept}, {dumped / s / 'data.jsonl'}" in log  # funasr's own count
    lost("epoch 2's half-written checkpoint only: model.pt still holds epoch 1, whole")


@pytest.mark.fault_slow
def test_without_it_the_same_kill_leaves_a_model_pt_that_does_not_load(dumped: Path, tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    rc, log = train(dumped.parent, exp, 2, kill="model.pt:2:0", atomic=False)
    assert rc != 0 and f"killing rank 0 with {exp}/model.pt/mp_rank_00_model_states.pt" in log, log[-3000:]
    with pytest.raises(RuntimeError, match="failed finding central directory"):
        states(exp / "model.pt")  # what funasr's resume would load next: the rerun dies on it


DDP_RUN = """import os, sys, torch
from funasr_recipe.compat import checkpoint_io
checkpoint_io.install()
from funasr.train_utils.trainer_ds import Trainer
t = Trainer(output_dir=sys.argv[1], device="cpu", avg_keep_nbest_models_type="loss", keep_nbest_models=5)
model = torch.nn.Linear(3, 2)
optim = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optim, 1)
t.resume_checkpoint(model=model, optim=optim, scheduler=scheduler)
for epoch in range(t.start_epoch + 1, int(sys.argv[2]) + 1):
    t.val_loss_step_or_epoch[f"model.pt.ep{epoch}"] = 10.0 / epoch  # each epoch the best so far
    with torch.no_grad():
        model.weight.fill_(epoch)
    t.save_checkpoint(epoch, model=model, optim=optim, scheduler=scheduler)
"""


def test_ddp_files_the_pointer_last(tmp_path: Path) -> None:
    """funasr's own DDP-path save (one file per checkpoint, rank 0) in a real Trainer: killed writing
    epoch 3's best copy, model.pt still holds epoch 2 (it is renamed after the best copy), and a rerun
    resumes from it."""
    script, exp = tmp_path / "ddp.py", tmp_path / "exp"
    script.write_text(DDP_RUN)

    def run(epochs: int, kill: str = "") -> subprocess.CompletedProcess:
        env = {**CLEAN_ENV, **RANKS_ENV, KILL_ENV: kill}
        return subprocess.run([sys.executable, str(script), str(exp), str(epochs)], cwd=ROOT, text=True,
                              capture_output=True, timeout=300, env=env)

    res = run(4, kill="model.pt.best:3")
    assert res.returncode == -9, res.stderr[-2000:]
    assert (exp / ".tmp.model.pt.best").is_file() and (exp / ".tmp.model.pt").is_file()
    load = lambda name: torch.load(exp / name, weights_only=True)  # noqa: E731
    assert load("model.pt")["epoch"] == 2 and load("model.pt.best")["epoch"] == 2
    res = run(4)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "removed" in res.stderr and ".tmp.model.pt.best" in res.stderr
    assert load("model.pt")["epoch"] == 4 and load("model.pt.best")["best_step_or_epoch"] == "model.pt.ep4"
    assert float(load("model.pt.best")["state_dict"]["weight"][0, 0]) == 4.0
    assert sorted(p.name for p in exp.iterdir() if p.name.startswith("model.pt")) == [
        "model.pt", "model.pt.best", "model.pt.ep1", "model.pt.ep2", "model.pt.ep3", "model.pt.ep4"]


def test_recover_removes_temporaries_and_puts_back_a_replaced_checkpoint(tmp_path: Path) -> None:
    for name in (".tmp.model.pt", ".old.model.pt", ".old.model.pt.ep1", "model.pt.ep1"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text(name)
    (tmp_path / ".tmp.latest").write_text("model.pt")
    done = recover(tmp_path)
    assert len(done) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "model.pt.ep1"]
    # model.pt was missing (a kill between the two renames): the replaced copy is back.
    assert (tmp_path / "model.pt" / "f").read_text() == ".old.model.pt"
    assert (tmp_path / "model.pt.ep1" / "f").read_text() == "model.pt.ep1"
    assert recover(tmp_path) == []


def test_swap_in_replaces_dirs_and_files(tmp_path: Path) -> None:
    for kind in ("dir", "file"):
        final, tmp = tmp_path / f"{kind}.pt", tmp_path / f".tmp.{kind}.pt"
        for path, text in ((final, "old"), (tmp, "new")):
            if kind == "dir":
                path.mkdir()
                (path / "x").write_text(text)
            else:
                path.write_text(text)
        swap_in(tmp, final)
        assert (final / "x" if kind == "dir" else final).read_text() == "new"
        assert not tmp.exists() and not (tmp_path / f".old.{kind}.pt").exists()


def test_check_kept_makes_the_best_copy_the_resumed_states(tmp_path: Path) -> None:
    """A kill after model.pt.best was renamed but before model.pt: the resumed state's best is epoch 1,
    the best copy holds epoch 2. It is replaced by a copy of epoch 1; a lost checkpoint is named."""
    for epoch in (1, 2):
        name = f"model.pt.ep{epoch}"
        torch.save({"epoch": epoch, "best_step_or_epoch": name}, tmp_path / name)
    (tmp_path / "model.pt.best").write_bytes((tmp_path / "model.pt.ep2").read_bytes())
    warnings = check_kept(tmp_path, "model.pt.ep1", {"model.pt.ep1": 1.0, "model.pt.ep0": 2.0})
    assert torch.load(tmp_path / "model.pt.best", weights_only=True)["epoch"] == 1
    assert any("model.pt.ep0" in w for w in warnings) and any("copied model.pt.ep1" in w for w in warnings)
    assert check_kept(tmp_path, "model.pt.ep1", {"model.pt.ep1": 1.0}) == []


def test_kill_spec_is_off_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KILL_ENV, raising=False)
    assert Kill.from_env() is None
    monkeypatch.setenv(KILL_ENV, "model.pt.ep3:3")
    assert Kill.from_env() == Kill("model.pt.ep3", 3, 0)
    monkeypatch.setenv(KILL_ENV, "model.pt:x")
    with pytest.raises(ValueError, match="<checkpoint name>:<epoch>"):
        Kill.from_env()


def test_deepspeed_shards_need_the_allowlist(tmp_path: Path) -> None:
    """What the allowlist is for: a ZeRO shard is refused by weights_only without it."""
    loss_scaler, _, zero_stage, _ = deepspeed_safe_globals()
    shard = {"loss_scaler": loss_scaler(scale=1.0), "zero_stage": zero_stage(1)}
    torch.save(shard, tmp_path / "shard.pt")
    with pytest.raises(pickle.UnpicklingError, match="LossScaler"):
        torch.load(tmp_path / "shard.pt", weights_only=True)
    with torch.serialization.safe_globals(deepspeed_safe_globals()):
        assert torch.load(tmp_path / "shard.pt", weights_only=True)["zero_stage"] == shard["zero_stage"]
