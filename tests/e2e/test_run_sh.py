"""run.sh: option parsing, stage 0 on the bundled corpus, markers, replay script, node-0-only waits."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.run_sh import CLEAN_ENV, ROOT, dirs, run_sh

N_BUNDLED = 2500  # recordings in corpora/free-spoken-digit-dataset
OPTIONS = ("--stage", "--stop-stage", "--config", "--corpus", "--corpus-dir", "--data-dir", "--dump-dir",
           "--exp-dir", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--nproc-per-node",
           "--nj", "--strict", "--allow-pipes", "--max-duration", "--prep-opts", "--wait-timeout",
           "--decode-dir", "--decode-batch-size", "--preflight", "--comm-profile", "--socket-ifname",
           "--metrics-port", "--grad-checkpoint", "--oom-probe", "--memory-limit-gib",
           "--max-bad-steps", "--serve-host", "--serve-port", "--serve-precision", "--replay-dir",
           "--replay-ratio", "--pseudo-label-dir", "--pseudo-min-logprob", "--freeze", "--adapter",
           "--lora-rank", "--lora-targets", "--regression-dir", "--max-regression", "--regression-fatal")






def test_help_lists_every_option() -> None:
    res = run_sh("--help")
    assert res.returncode == 0
    for opt in OPTIONS:
        assert f"  {opt} " in res.stdout, opt
    assert "[default: 0]" in res.stdout and "-- ++dataset_conf.batch_size" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["--no-such-option", "1"], "unknown option --no-such-option"),
    (["stray"], "unexpected argument 'stray'"),
    (["--stage"], "option --stage needs a value"),
    (["--stop_stage", "two"], "--stop-stage must be an integer"),
    (["--nj", "-1"], "--nj must be a positive integer"),
    (["--nj", "0"], "--nj must be a positive integer, got '0'"),
    (["--stage", "3", "--stop-stage", "2"], "--stop-stage 2 is below --stage 3: no stage would run"),
    (["--restart", "yes"], "--restart must be true or false"),
    (["--", "++train_conf.max_epoch=1", "--stage", "3"],
     "--stage comes after --: run.sh options go before --"),
    (["--comm-profile", "wifi"], "--comm-profile must be default, ethernet, infiniband or debug"),
    (["--memory-limit-gib", "lots"], "--memory-limit-gib must be a number of GiB"),
    (["--preflight", "maybe"], "--preflight must be true or false"),
    (["--serve-precision", "fp16"], "--serve-precision must be fp32 or int8"),
    (["--nnodes", "2", "--node-rank", "2"], "--node-rank 2 is not below --nnodes 2"),
    (["--corpus", "nosuch"], "--corpus nosuch: no recipes/nosuch/"),
    (["--strict", "maybe"], "--strict must be true or false"),
    (["--adapter", "qlora"], "--adapter must be none or lora"),
    (["--lora-rank", "0"], "--lora-rank must be a positive integer"),
    (["--replay-ratio", "-1"], "--replay-ratio must be auto or a number >= 0"),
    (["--max-regression", "one"], "--max-regression must be a number >= 0"),
    (["--pseudo-min-logprob", "low"], "--pseudo-min-logprob must be a number"),
    (["--regression-fatal", "yes"], "--regression-fatal must be true or false"),
])
def test_bad_options_print_help_and_fail(args: list[str], message: str) -> None:
    res = run_sh(*args)
    assert res.returncode == 2
    assert "Usage:" in res.stderr and message in res.stderr


def test_stage0_bundled_corpus_then_rerun_skips(tmp_path: Path) -> None:
    # underscore and = spellings of options are accepted too
    res = run_sh("--stage", "0", "--stop_stage=0", *dirs(tmp_path), "--", "++train_conf.max_epoch=3")
    assert res.returncode == 0, res.stderr
    assert "Stage 0: data preparation" in res.stderr
    counts = {}
    for name in ("train", "dev"):
        set_dir = tmp_path / "data" / name
        report = json.loads((set_dir / "report.json").read_text())
        counts[name] = len((set_dir / "data.jsonl").read_text().splitlines())
        assert report["accepted"] == counts[name] and report["rejected"] == 0
        assert (set_dir / ".done").is_file()
    assert sum(counts.values()) == N_BUNDLED
    assert (tmp_path / "data" / ".done").is_file()
    replay = (tmp_path / "exp" / "replay.sh").read_text()
    # Options given to the replay script go before the trainer's overrides.
    assert '--stage 0 --stop-stage 0 "$@" -- ++train_conf.max_epoch=3' in replay
    assert f"--data-dir {tmp_path / 'data'}" in replay

    res = run_sh("--stage", "0", "--stop-stage", "0", *dirs(tmp_path))
    assert res.returncode == 0 and "is done; skipping" in res.stderr
    res = subprocess.run([str(tmp_path / "exp" / "replay.sh")], capture_output=True, text=True,
                         env=CLEAN_ENV, timeout=120)
    assert res.returncode == 0 and "is done; skipping" in res.stderr

    # Another validation option invalidates the markers, but the recipe output is reused.
    res = run_sh("--stage", "0", "--stop-stage", "0", "--max-duration", "1.0", *dirs(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "validating" in res.stderr and "recipes/fsdd" not in res.stderr
    report = json.loads((tmp_path / "data" / "train" / "report.json").read_text())
    assert report["rejected_by_reason"].get("too_long", 0) > 0
    assert report["accepted"] + report["rejected"] == counts["train"]


def test_other_node_times_out_with_a_clear_message(tmp_path: Path) -> None:
    res = run_sh("--stop-stage", "0", "--nnodes", "2", "--node-rank", "1", "--wait-timeout", "1",
                 *dirs(tmp_path))
    assert res.returncode == 1
    assert "waited 1s for node 0 to finish stage 0" in res.stderr
    assert "filesystem all nodes share" in res.stderr
    assert not (tmp_path / "data" / "train").exists()  # node 1 never prepares data itself


def test_run_sh_starts_from_any_directory_by_a_relative_path(tmp_path: Path) -> None:
    """"$0" is read after run.sh has changed to its own directory: it must not matter where it was started
    from, nor by which path."""
    res = subprocess.run([f"{ROOT.name}/run.sh", "--help"], cwd=ROOT.parent, capture_output=True, text=True,
                         env=CLEAN_ENV, timeout=60)
    assert res.returncode == 0 and "  --stage " in res.stdout, res.stderr
    relative = os.path.relpath(ROOT / "run.sh", tmp_path)
    assert relative.startswith("..")
    res = subprocess.run([relative, "--stop-stage", "0", *dirs(tmp_path)], cwd=tmp_path, capture_output=True,
                         text=True, env=CLEAN_ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "data" / ".done").is_file()


def test_every_node_writes_the_same_replay_script(tmp_path: Path) -> None:
    """replay.sh in the shared exp dir holds no --node-rank: the last node to write it does not make it
    replay as that node."""
    node1 = subprocess.run(["./run.sh", "--stop-stage", "0", "--nnodes", "2", "--node-rank", "1",
                            "--wait-timeout", "1", *dirs(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                           env=CLEAN_ENV, timeout=60)
    assert node1.returncode == 1  # node 0 never ran
    replay = (tmp_path / "exp" / "replay.sh").read_text()
    assert "--nnodes 2" in replay and "--node-rank" not in replay.splitlines()[-1]


@pytest.mark.parametrize("node_env", [
    {"NNODES": "2", "NODE_RANK": "1"},
    {"SLURM_NNODES": "2", "SLURM_NODEID": "1"},
])
def test_other_node_waits_for_node0(tmp_path: Path, node_env: dict) -> None:
    """Node 1 (options from the environment) starts first and proceeds once node 0 is done."""
    node1 = subprocess.Popen(["./run.sh", "--stop-stage", "0", "--wait-timeout", "120", *dirs(tmp_path)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**CLEAN_ENV, **node_env})
    time.sleep(3)
    assert node1.poll() is None, "node 1 did not wait"
    node0 = run_sh("--stop-stage", "0", "--nnodes", "2", "--node-rank", "0", *dirs(tmp_path))
    assert node0.returncode == 0, node0.stderr
    _, err = node1.communicate(timeout=60)
    assert node1.returncode == 0, err
    assert "[node1]" in err and "waiting for node 0 to finish stage 0" in err


def test_kaldi_dir_with_every_bad_kind(tmp_path: Path) -> None:
    """The issue's must-show: rejected.tsv names each bad utterance and the run succeeds; strict fails."""
    from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR, EXPECTED, make_bad_kaldi_dir

    bad = tmp_path / "bad"
    make_bad_kaldi_dir(bad, sorted(DEFAULT_WAV_DIR.glob("*.wav")))
    res = run_sh("--stop-stage", "0", "--corpus", "kaldi", "--corpus-dir", str(bad), *dirs(tmp_path))
    assert res.returncode == 0, res.stderr
    rejected, accepted = {}, set()
    for set_dir in (p for p in (tmp_path / "data").iterdir() if (p / "rejected.tsv").exists()):
        for row in (set_dir / "rejected.tsv").read_text(encoding="utf-8").splitlines()[1:]:
            file, line, key, reason, _ = row.split("\t", 4)
            assert Path(file).parent == set_dir and (line.isdigit() or line == "")
            rejected[key] = reason
        accepted |= {json.loads(x)["key"] for x in (set_dir / "data.jsonl").read_text().splitlines()}
    assert rejected == {k: r for k, r in EXPECTED.items() if r != "ok"}
    assert accepted == {k for k, r in EXPECTED.items() if r == "ok"}

    res = run_sh("--stop-stage", "0", "--corpus", "kaldi", "--corpus-dir", str(bad), "--strict", "true",
                 "--data-dir", str(tmp_path / "strict"), "--exp-dir", str(tmp_path / "exp"))
    assert res.returncode != 0
    assert "strict mode:" in res.stderr and "bad_" in res.stderr.split("strict mode:")[1].splitlines()[0]
    assert not (tmp_path / "strict" / ".done").exists()
