"""Bad input, found as a hostile user would plant it (tests/faults/hostile_corpus.py), through stages 0-2
of run.sh: each kind is caught, named by file, line and key, and costs only its own utterance."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from funasr_recipe.core.jsonl import iter_jsonl
from tests.faults.hostile_corpus import HOSTILE, build
from tests.faults.procs import processes_with
from tests.helpers.run_sh import CLEAN_ENV, ROOT
from tests.helpers.train_fixtures import FAST, free_port

pytestmark = pytest.mark.fault_slow
NO_DAC = ("--bounding-set=-dac_override,-dac_read_search",)


def unprivileged(tmp: Path) -> tuple[str, ...]:
    """A prefix under which chmod 000 denies a read even to root (setpriv), or () when not root."""
    if os.geteuid() != 0:
        return ()
    setpriv, probe = shutil.which("setpriv"), tmp / "probe"
    probe.write_bytes(b"x")
    probe.chmod(0)
    ok = setpriv and subprocess.run([setpriv, *NO_DAC, "cat", str(probe)],
                                    capture_output=True).returncode != 0
    return (setpriv, *NO_DAC) if ok else ()


def run_stages(root: Path, prefix: tuple[str, ...], first: int, last: int, *more: str
               ) -> subprocess.CompletedProcess:
    args = ["./run.sh", "--stage", str(first), "--stop-stage", str(last), "--corpus", "kaldi", "--corpus-dir",
            str(root / "corpus"), "--data-dir", str(root / "data"), "--dump-dir", str(root / "dump"),
            "--exp-dir", str(root / "exp"), "--allow-pipes", "true", "--master-port", str(free_port()), *more,
            "--", "++train_conf.max_epoch=1", *FAST]
    return subprocess.run([*prefix, *args], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**CLEAN_ENV, "RECIPE_PIPE_TIMEOUT_S": "3"})


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess, bool]:
    root = tmp_path_factory.mktemp("hostile")
    prefix = unprivileged(root)
    can_lock = prefix != () or os.geteuid() != 0
    build(root / "corpus", lock=can_lock)
    res = run_stages(root, prefix, 0, 2)
    assert res.returncode == 0, res.stderr[-5000:]
    return root, res, can_lock


def table(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def rejected(root: Path, stage_dir: str, set_name: str = "train") -> dict[str, dict[str, str]]:
    return {row["key"]: row for row in table(root / stage_dir / set_name / "rejected.tsv")}


def dumped(root: Path, set_name: str = "train") -> list[dict]:
    return [obj for _, obj in iter_jsonl(root / "dump" / set_name / "data.jsonl")]


@pytest.mark.fault("a user key sp0.9-X beside X (the name of X's speed-perturbed copy)")
def test_a_key_that_clashes_with_a_derived_key_is_rejected_and_every_key_stays_unique(hostile, lost) -> None:
    root, _, _ = hostile
    row = rejected(root, "data")[HOSTILE["clash"]]
    assert row["reason"] == "derived_key_clash" and row["file"].endswith("train/wav.scp") and row["line"]
    lines = dumped(root)
    assert len({o["key"] for o in lines}) == len(lines)
    assert len({o["source"] for o in lines}) == len(lines)  # no two lines share an ark offset
    copies = {f"{p}george-0_george_0" for p in ("", "sp0.9-", "sp1.1-")}
    assert copies <= {o["key"] for o in lines}
    lost(f"1 utterance ({HOSTILE['clash']}), named in data/train/rejected.tsv as derived_key_clash")


@pytest.mark.fault("audio at 11025, 16001 and 44101 Hz with speed perturbation; a 1-sample wav")
def test_odd_rates_are_featurized_and_a_one_sample_wav_is_rejected(hostile, lost) -> None:
    root, _, _ = hostile
    keys = {o["key"]: o for o in dumped(root)}
    for rate in ("r11025", "r16001", "r44101"):
        frames = [keys[f"{p}george-{rate}"]["source_len"] for p in ("sp0.9-", "", "sp1.1-")]
        assert frames[0] > frames[1] > frames[2] > 0, (rate, frames)
    row = rejected(root, "data")[HOSTILE["one_sample"]]
    assert row["reason"] == "too_short"
    lost(f"1 utterance ({HOSTILE['one_sample']}: too_short in stage 0); the odd rates cost nothing")


@pytest.mark.fault("a 100-word transcript on a 0.5 s clip (impossible for CTC)")
def test_a_transcript_too_long_for_its_audio_is_rejected_in_stage_1(hostile, lost) -> None:
    root, _, _ = hostile
    rows = [r for k, r in rejected(root, "dump").items() if k.endswith(HOSTILE["ctc"])]
    assert len(rows) == 3 and {r["reason"] for r in rows} == {"target_too_long_for_audio"}
    lost(f"1 utterance ({HOSTILE['ctc']}, its 3 speed copies), in dump/train/rejected.tsv")


@pytest.mark.fault("a 25 s utterance, over the config's max_token_length")
def test_an_utterance_stage_2_leaves_out_is_listed_before_training(hostile, lost) -> None:
    root, res, _ = hostile
    skipped = table(root / "exp" / "train_skipped.tsv")
    keys = {r["key"] for r in skipped}
    assert HOSTILE["long"] in keys, skipped
    assert "max_token_length" in res.stderr and "train_skipped.tsv" in res.stderr
    lost(f"{len(skipped)} training copies of 1 utterance ({HOSTILE['long']}), listed in "
         "exp/train_skipped.tsv")


@pytest.mark.fault("a UTF-8 BOM in train's tables, CR-only and CRLF line ends in dev's")
def test_byte_order_marks_and_old_line_ends_lose_nothing(hostile, lost) -> None:
    root, _, _ = hostile
    raw = (root / "corpus" / "train" / "wav.scp").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")
    first = raw[3:].split(b" ", 1)[0].decode()  # the key right after the mark
    assert first in {o["key"] for o in dumped(root)}, first
    report = json.loads((root / "data" / "dev" / "report.json").read_text())
    assert report["input_entries"] == 12 and report["accepted"] == 12, report


@pytest.mark.fault("the same utterance in train and dev (same key; same audio file)")
def test_an_utterance_in_two_sets_is_warned_and_listed(hostile, lost) -> None:
    root, res, _ = hostile
    rows = table(root / "data" / "overlap.tsv")
    kinds = sorted(r["kind"] for r in rows)
    assert kinds == ["audio", "key"], rows
    assert "overlap.tsv" in res.stderr and "--strict true" in res.stderr
    lost("nothing dropped: 2 overlaps warned and listed in data/overlap.tsv (fatal with --strict true)")


@pytest.mark.fault("a key holding U+2028 (a line separator to str.splitlines)")
def test_a_key_with_a_line_separator_survives(hostile, lost) -> None:
    root, _, _ = hostile
    assert {HOSTILE["line_sep"], "sp0.9-" + HOSTILE["line_sep"]} <= {o["key"] for o in dumped(root)}


@pytest.mark.fault("a wav this user may not read; a `cmd |` pipe that never ends")
def test_an_unreadable_wav_and_a_hung_pipe_are_named_and_cleaned_up(hostile, lost) -> None:
    root, _, can_lock = hostile
    rows = rejected(root, "data")
    if can_lock:
        assert rows[HOSTILE["locked"]]["reason"] == "permission_denied"
        assert "permission denied" in rows[HOSTILE["locked"]]["detail"]
    hung = rows[HOSTILE["hung"]]
    assert hung["reason"] == "pipe_failed" and "ran over 3s" in hung["detail"]
    assert not processes_with("sleep 600")
    lost("2 utterances, named in data/train/rejected.tsv (permission_denied, pipe_failed); the pipe's "
         "processes killed" + ("" if can_lock else "; root without setpriv: the lock was not tested"))


@pytest.mark.fault("a transcript edited in the corpus after stage 0 had run")
def test_an_edited_corpus_is_read_again(hostile, lost) -> None:
    root, _, _ = hostile
    text = root / "corpus" / "train" / "text"
    key = "jackson-5_jackson_0"
    text.write_bytes(text.read_bytes().replace(f"{key} FIVE".encode(), f"{key} FIVE FIVE".encode()))
    res = run_stages(root, unprivileged(root), 0, 1)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"since stage 0 last ran: 1 modified: {text}" in res.stderr
    assert {o["key"]: o["target"] for o in dumped(root)}[key] == "FIVE FIVE"
    lost("nothing: stage 0 and 1 redone, the log names the file that changed")
