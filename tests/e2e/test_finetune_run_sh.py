"""run.sh's fine-tuning options at stage 0: replay dirs validated like the corpus's sets (and a replay
dir with no usable utterance fatal, naming it), repeated --replay-dir options accumulating.

  .venv/bin/python -m pytest tests/e2e/test_finetune_run_sh.py -q
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.helpers.run_sh import ROOT, run_sh

WAVS = sorted((ROOT / "corpora" / "free-spoken-digit-dataset" / "recordings").glob("*_theo_*.wav"))


def kaldi_dir(path: Path, entries: list[tuple[str, str, str]]) -> Path:
    """A Kaldi dir of (key, wav path, transcript) lines."""
    path.mkdir(parents=True)
    (path / "wav.scp").write_text("".join(f"{k} {w}\n" for k, w, _ in entries))
    (path / "text").write_text("".join(f"{k} {t}\n" for k, _, t in entries))
    (path / "utt2spk").write_text("".join(f"{k} {k.split('-')[0]}\n" for k, _, _ in entries))
    return path


def stage0(tmp: Path, *extra: str):
    return run_sh("--stop-stage", "0", "--data-dir", str(tmp / "data"), "--exp-dir", str(tmp / "exp"), *extra)


def test_replay_dirs_are_validated_into_data(tmp_path: Path) -> None:
    a = kaldi_dir(tmp_path / "old_a", [(f"theo-{w.stem}", str(w), "SEVEN") for w in WAVS[:4]])
    b = kaldi_dir(tmp_path / "old_b", [(f"theo-{w.stem}", str(w), "NINE") for w in WAVS[4:7]])
    res = stage0(tmp_path, "--replay-dir", str(a), "--replay-dir", str(b))
    assert res.returncode == 0, res.stderr[-3000:]
    for name, n in (("replay_old_a", 4), ("replay_old_b", 3)):
        lines = (tmp_path / "data" / name / "data.jsonl").read_text().splitlines()
        assert len(lines) == n and all(json.loads(x)["source"].endswith(".wav") for x in lines)
    assert "--replay-dir" in (tmp_path / "exp" / "replay.sh").read_text()


def test_replay_dir_with_no_usable_utterance_is_fatal_and_named(tmp_path: Path) -> None:
    bad = kaldi_dir(tmp_path / "old", [("theo-x1", str(tmp_path / "missing.wav"), "SEVEN"),
                                       ("theo-x2", str(WAVS[0]), "")])
    res = stage0(tmp_path, "--replay-dir", str(bad))
    assert res.returncode != 0
    assert "replay_old: no utterance was accepted" in res.stderr
    rejected = (tmp_path / "data" / "replay_old" / "rejected.tsv").read_text()
    assert "theo-x1" in rejected and "theo-x2" in rejected
    assert not (tmp_path / "data" / ".done").exists()


def test_replay_dir_without_text_says_so(tmp_path: Path) -> None:
    d = kaldi_dir(tmp_path / "old", [(f"theo-{w.stem}", str(w), "SEVEN") for w in WAVS[:2]])
    (d / "text").unlink()
    res = stage0(tmp_path, "--replay-dir", str(d))
    assert res.returncode != 0 and f"--replay-dir {d} needs wav.scp and text" in res.stderr


def test_replay_given_as_a_data_jsonl(tmp_path: Path) -> None:
    """A FunASR JSONL (key, source, target, tags; gzipped too) is a replay set, read as --corpus jsonl
    reads one: written as a Kaldi dir, then validated like one (a missing audio file and a line without
    target rejected and listed); a line that is not a usable record names file and line."""
    pool = tmp_path / "pool"
    pool.mkdir()
    lines = [{"key": f"theo-{w.stem}", "source": str(w), "target": "SEVEN", "text_language": "<|en|>",
              "with_or_wo_itn": "<|withitn|>"} for w in WAVS[:3]]
    lines.append({"key": "theo-gone", "source": str(tmp_path / "gone.wav"), "target": "NINE"})
    lines.append({"key": "theo-silent", "source": str(WAVS[3])})
    (pool / "data.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    res = stage0(tmp_path, "--replay-dir", str(pool / "data.jsonl.gz"))
    assert res.returncode == 0, res.stderr[-3000:]
    written = (tmp_path / "data" / "replay_pool" / "data.jsonl").read_text().splitlines()
    accepted = [json.loads(x) for x in written]
    assert sorted(x["key"] for x in accepted) == sorted(x["key"] for x in lines[:3])
    assert {x["with_or_wo_itn"] for x in accepted} == {"<|withitn|>"}  # the line's own, kept
    rejected = (tmp_path / "data" / "replay_pool" / "rejected.tsv").read_text()
    assert "theo-gone" in rejected and "theo-silent\tempty_transcript" in rejected, rejected

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(lines[0]) + "\n" + json.dumps({"key": "k k", "source": str(WAVS[0])}) + "\n")
    res = stage0(tmp_path / "b", "--replay-dir", str(bad))
    assert res.returncode != 0 and f"{bad}:2: key must be a string without whitespace" in res.stderr


def recorded_model_dir(path: Path, train_data: Path | None) -> Path:
    """A model dir as stage 3 writes one (the released architecture's config.yaml), recording the
    training set it was trained on, or nothing as a hub model."""
    from funasr_recipe.families.registry import SENSEVOICE
    from funasr_recipe.model.released import released_path

    path.mkdir(parents=True)
    (path / "config.yaml").write_text(released_path(SENSEVOICE.released).read_text())
    recipe = {"exp_dir": str(path), "checkpoint": "model.pt.avg5"}
    if train_data is not None:
        recipe["train_data"] = str(train_data)
    (path / "configuration.json").write_text(json.dumps({"recipe": recipe}))
    return path


def test_a_regression_set_replays_the_training_set_the_model_records(tmp_path: Path) -> None:
    old = kaldi_dir(tmp_path / "old_train", [(f"theo-{w.stem}", str(w), "SEVEN") for w in WAVS[:5]])
    regress = kaldi_dir(tmp_path / "old_dev", [(f"theo-{w.stem}", str(w), "SEVEN") for w in WAVS[5:8]])
    finetune = ("--config", "conf/sensevoice_small.yaml", "--regression-dir", str(regress))
    model = recorded_model_dir(tmp_path / "model", old)
    res = stage0(tmp_path / "a", *finetune, "--pretrained-dir", str(model))
    assert res.returncode == 0, res.stderr[-3000:]
    # at 3 old utterances per new one unless told (bench_adapt: at 1 the old speakers lost up to 3 points)
    assert f"replaying {old}, the training set {model} records, at --replay-ratio 3 " in res.stderr
    assert len((tmp_path / "a" / "data" / "replay_old_train" / "data.jsonl").read_text().splitlines()) == 5
    res = stage0(tmp_path / "d", *finetune, "--pretrained-dir", str(model), "--replay-ratio", "0.5")
    assert res.returncode == 0 and "records, at --replay-ratio 0.5 " in res.stderr, res.stderr[-3000:]
    # Asked for none: none, and nothing said about a default.
    res = stage0(tmp_path / "b", *finetune, "--pretrained-dir", str(model), "--replay-dir", "none")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "replaying" not in res.stderr and not list((tmp_path / "b" / "data").glob("replay_*"))
    # A hub model records no training set: a warning, no replay.
    hub = recorded_model_dir(tmp_path / "hub", None)
    res = stage0(tmp_path / "c", *finetune, "--pretrained-dir", str(hub))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "--regression-dir without a replay set" in res.stderr
    assert not list((tmp_path / "c" / "data").glob("replay_*"))
