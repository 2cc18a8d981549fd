"""Tests of stage 0's validator (local.prepare_data) against its spec: one utterance of every bad kind.

Reads the real wavs of corpora/free-spoken-digit-dataset/recordings (the tests skip when the folder is
missing) through tests.helpers.make_bad_kaldi_dir; writes only under pytest's tmp_path.

  python -m pytest tests/unit/data/test_prepare_data.py -q
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.validate import validate_set
from tests.helpers import make_bad_kaldi_dir as mbk

ROOT = Path(__file__).resolve().parents[3]
KALDI_FILES = ("wav.scp", "text", "utt2spk", "spk2utt", "utt2lang", "utt2emo", "utt2event")
JSONL_FIELDS = {"key", "source", "source_len", "target", "target_len", "text_language", "emo_target",
                "event_target", "with_or_wo_itn", "sample_rate", "channels"}
OPTIONAL_FIELDS = {"speaker"}  # from utt2spk, or the key itself when there is no utt2spk
SPEC_REPORT_KEYS = ("set", "input_entries", "accepted", "rejected", "rejected_by_reason", "converted",
                    "hours")
STRICT_MESSAGE = re.compile(
    r"(?P<file>.+):(?P<line>\d+): (?P<key>[^:\s]*): (?P<reason>[a-z0-9_]+): (?P<detail>.*)")
CLI_TIMEOUT_S = 30  # a pool that deadlocks must fail the test, not hang the suite


def real_wavs() -> list[Path]:
    wavs = sorted(mbk.DEFAULT_WAV_DIR.glob("*.wav"))
    if not wavs:
        pytest.skip(f"{mbk.DEFAULT_WAV_DIR} has no wavs (the bundled corpus is missing)")
    return wavs


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bad")
    assert mbk.make_bad_kaldi_dir(out, real_wavs()) == mbk.EXPECTED
    return out


def fresh_set(src: Path, dest: Path) -> Path:
    """Copy the Kaldi files of src (not the audio they point to) into a new set dir dest."""
    dest.mkdir(parents=True)
    for name in KALDI_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dest / name)
    return dest


def read_outputs(set_dir: Path) -> tuple[dict, list[dict], list[dict]]:
    """report.json, data.jsonl objects, rejected.tsv rows (dicts) of a validated set dir."""
    report = json.loads((set_dir / "report.json").read_text(encoding="utf-8"))
    jsonl = [json.loads(line) for line in (set_dir / "data.jsonl").read_text(encoding="utf-8").split("\n")
             if line]
    lines = (set_dir / "rejected.tsv").read_bytes().decode("utf-8").split("\n")
    assert lines[0] == "file\tline\tkey\treason\tdetail"
    assert lines[-1] == "", "rejected.tsv must end with a newline"
    rows = [dict(zip(("file", "line", "key", "reason", "detail"), row.split("\t", 4), strict=True))
            for row in lines[1:-1]]
    return report, jsonl, rows


def kaldi_values(set_dir: Path, name: str) -> dict[str, list[tuple[int, bytes]]]:
    """key -> [(1-based line number, raw value)] of one Kaldi file (independently of the validator)."""
    table: dict[str, list[tuple[int, bytes]]] = {}
    for n, line in enumerate((set_dir / name).read_bytes().split(b"\n"), start=1):
        key, _, value = line.partition(b" ")
        if key:
            table.setdefault(key.decode("utf-8", "replace"), []).append((n, value))
    return table


def duration_frames(info: object) -> int:
    """source_len as the spec defines it: int(duration_seconds * 100), from a soundfile.info()."""
    return int(info.frames / info.samplerate * 100)  # type: ignore[attr-defined]


def write_small_set(set_dir: Path, utts: list[tuple[str, str, str]]) -> Path:
    """A hand-made set dir: (key, wav.scp value, transcript) lines in the given order; no utt2* files."""
    set_dir.mkdir(parents=True, exist_ok=True)
    (set_dir / "wav.scp").write_text("".join(f"{k} {p}\n" for k, p, _ in utts), encoding="utf-8")
    (set_dir / "text").write_text("".join(f"{k} {t}\n" for k, _, t in utts), encoding="utf-8")
    return set_dir


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "local.prepare_data", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


@pytest.fixture(scope="module")
def default_run(bad_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list, list]:
    set_dir = fresh_set(bad_dir, tmp_path_factory.mktemp("run") / "train")
    returned = validate_set(set_dir, language="en")
    report, jsonl, rows = read_outputs(set_dir)
    assert returned == report
    return set_dir, report, jsonl, rows


@pytest.mark.parametrize(("key", "reason"), sorted(mbk.EXPECTED.items()))
def test_each_entry_gets_its_reason_file_and_line(default_run: tuple, key: str, reason: str) -> None:
    set_dir, _, jsonl, rows = default_run
    mine = [r for r in rows if r["key"] == key]
    accepted = [o for o in jsonl if o["key"] == key]
    if reason == "ok":
        assert not mine and len(accepted) == 1
        return
    assert not accepted, f"{key} must not reach data.jsonl"
    assert len(mine) == 1, f"one rejected.tsv row per entry: {mine}"
    row = mine[0]
    assert row["reason"] == reason, row
    name = mbk.REJECTED_IN[key]
    assert Path(row["file"]).name == name and Path(row["file"]).parent.name == set_dir.name, row
    lines = [n for n, _ in kaldi_values(set_dir, name)[key]]
    assert int(row["line"]) in lines, f"{row} should name line {lines} of {name}"
    assert row["detail"].strip(), f"{key}: a rejection needs a detail"


def test_report_counts_add_up(default_run: tuple) -> None:
    set_dir, report, jsonl, rows = default_run
    assert report["set"] in (set_dir.name, str(set_dir))
    assert report["input_entries"] == len(mbk.EXPECTED)
    assert report["input_entries"] == report["accepted"] + report["rejected"]
    assert report["accepted"] == len(jsonl) == sum(r == "ok" for r in mbk.EXPECTED.values())
    assert report["rejected"] == len(rows) == sum(report["rejected_by_reason"].values())
    assert report["rejected_by_reason"] == dict(Counter(r for r in mbk.EXPECTED.values() if r != "ok"))


def test_jsonl_schema_and_values(default_run: tuple) -> None:
    set_dir, _, jsonl, _ = default_run
    keys = [o["key"] for o in jsonl]
    assert keys == sorted(set(keys)), "data.jsonl must be sorted by key, one line per key"
    scp, text = kaldi_values(set_dir, "wav.scp"), kaldi_values(set_dir, "text")
    for o in jsonl:
        assert JSONL_FIELDS <= set(o) <= JSONL_FIELDS | OPTIONAL_FIELDS, set(o) ^ JSONL_FIELDS
        assert o.get("speaker", o["key"].split("-")[0]) == o["key"].split("-")[0]  # utt2spk
        assert o["source"] == scp[o["key"]][0][1].decode() and Path(o["source"]).is_absolute()
        info = sf.info(o["source"])
        assert (o["sample_rate"], o["channels"]) == (info.samplerate, info.channels)
        assert type(o["source_len"]) is int and o["source_len"] == duration_frames(info), o
        target = " ".join(text[o["key"]][0][1].decode().split())
        assert o["target"] == target
        assert o["target_len"] == (len(target.split()) if " " in target else len(target))
        tags = ("<|zh|>", "<|HAPPY|>", "<|Laughter|>") if o["key"] == mbk.KEY["ok_tagged"] else \
            ("<|en|>", "<|NEUTRAL|>", "<|Speech|>")
        assert (o["text_language"], o["emo_target"], o["event_target"]) == tags, o
        assert o["with_or_wo_itn"] == "<|woitn|>"
    by_key = {o["key"]: o for o in jsonl}
    collapsed = by_key[mbk.KEY["ok_ws_collapse"]]
    assert (collapsed["target"], collapsed["target_len"]) == ("one two three", 3)
    one_word = by_key[mbk.KEY["ok_8k_a"]]
    assert " " not in one_word["target"] and one_word["target_len"] == len(one_word["target"])  # characters
    assert " " in by_key[mbk.KEY["ok_space_path"]]["source"]
    assert not by_key[mbk.KEY["ok_nonascii_path"]]["source"].isascii()


def test_converted_counts_and_hours(default_run: tuple) -> None:
    _, report, jsonl, _ = default_run
    infos = [sf.info(o["source"]) for o in jsonl]
    expected = {"resampled": sum(i.samplerate != 16000 for i in infos),
                "downmixed": sum(i.channels > 1 for i in infos),
                "requantized": sum(i.subtype != "PCM_16" for i in infos)}
    assert expected == {"resampled": 7, "downmixed": 1, "requantized": 1}  # 8 kHz originals, stereo, 24-bit
    assert {k: report["converted"][k] for k in expected} == expected
    assert math.isclose(report["hours"], sum(i.frames / i.samplerate for i in infos) / 3600, abs_tol=1e-3)


def test_allow_pipes_reads_the_header_through_the_pipe(bad_dir: Path, default_run: tuple,
                                                       tmp_path: Path) -> None:
    set_dir = fresh_set(bad_dir, tmp_path / "train")
    report = validate_set(set_dir, allow_pipes=True)
    _, jsonl, rows = read_outputs(set_dir)
    got = {r["key"]: r["reason"] for r in rows} | {o["key"]: "ok" for o in jsonl}
    assert got == mbk.EXPECTED | mbk.WITH_PIPES_ALLOWED
    pipe = next(o for o in jsonl if o["key"] == mbk.KEY["pipe_cat"])
    command = kaldi_values(set_dir, "wav.scp")[mbk.KEY["pipe_cat"]][0][1].decode()
    assert pipe["source"].strip() in (command, command.rstrip("|").strip())
    info = sf.info(str(bad_dir / "audio" / "pipe_src.wav"))
    assert (pipe["source_len"], pipe["sample_rate"]) == (duration_frames(info), info.samplerate)
    assert report["converted"]["resampled"] == default_run[1]["converted"]["resampled"] + 1


def test_nj2_and_rerun_give_identical_outputs(bad_dir: Path, tmp_path: Path) -> None:
    set_dir = fresh_set(bad_dir, tmp_path / "train")
    outputs = ("data.jsonl", "rejected.tsv")
    first = validate_set(set_dir, nj=1)
    once = {name: (set_dir / name).read_bytes() for name in outputs}
    (set_dir / "data.jsonl").write_text('{"key": "stale"}\n')  # a rerun must overwrite, not append or skip
    (set_dir / "rejected.tsv").write_text("stale\n")
    again = validate_set(set_dir, nj=1)
    assert {name: (set_dir / name).read_bytes() for name in outputs} == once
    done = cli("--set-dir", str(set_dir), "--nj", "2")  # a subprocess, so that a stuck pool times out
    assert done.returncode == 0, done.stderr
    assert {name: (set_dir / name).read_bytes() for name in outputs} == once
    parallel = json.loads((set_dir / "report.json").read_text(encoding="utf-8"))
    for report in (again, parallel):
        assert {k: report[k] for k in SPEC_REPORT_KEYS} == {k: first[k] for k in SPEC_REPORT_KEYS}


def test_utt2lang_overrides_declared_tags_and_utt2spk_is_optional(bad_dir: Path, tmp_path: Path) -> None:
    a, b = bad_dir / "audio" / "ok_8k_a.wav", bad_dir / "audio" / "ok_8k_b.wav"
    set_dir = write_small_set(tmp_path / "s", [("spk1_a", str(a), "zero"), ("spk1_b", str(b), "one")])
    (set_dir / "utt2lang").write_text("spk1_a zh\n", encoding="utf-8")
    report = validate_set(set_dir, language="en", emotion="SAD", event="BGM", itn="withitn")
    _, jsonl, rows = read_outputs(set_dir)
    assert report["accepted"] == 2 and not rows
    tags = {o["key"]: (o["text_language"], o["emo_target"], o["event_target"], o["with_or_wo_itn"])
            for o in jsonl}
    assert tags == {"spk1_a": ("<|zh|>", "<|SAD|>", "<|BGM|>", "<|withitn|>"),
                    "spk1_b": ("<|en|>", "<|SAD|>", "<|BGM|>", "<|withitn|>")}
    assert all(o.get("speaker", o["key"]) == o["key"] for o in jsonl)  # no utt2spk: speaker = key


def test_max_duration_is_configurable_and_inclusive(tmp_path: Path) -> None:
    x, sr = sf.read(str(real_wavs()[0]), dtype="int16")
    exact = np.resize(x, 2 * sr)  # exactly 2.0 s of real speech, repeated
    longer = np.resize(x, 3 * sr)
    sf.write(str(tmp_path / "two.wav"), exact, sr, subtype="PCM_16")
    sf.write(str(tmp_path / "three.wav"), longer, sr, subtype="PCM_16")
    set_dir = write_small_set(tmp_path / "s", [("s_three", str(tmp_path / "three.wav"), "a"),
                                               ("s_two", str(tmp_path / "two.wav"), "b")])
    validate_set(set_dir, max_duration=2.0)
    _, jsonl, rows = read_outputs(set_dir)
    assert [o["key"] for o in jsonl] == ["s_two"] and jsonl[0]["source_len"] == 200
    assert [(r["key"], r["reason"], r["line"]) for r in rows] == [("s_three", "too_long", "1")]
    assert validate_set(set_dir, max_duration=5.0)["accepted"] == 2


def test_line_without_readable_key_is_one_entry(bad_dir: Path, tmp_path: Path) -> None:
    a = bad_dir / "audio" / "ok_8k_a.wav"
    set_dir = write_small_set(tmp_path / "s", [("spk1_a", str(a), "zero")])
    with open(set_dir / "wav.scp", "ab") as f:
        f.write(b"spk1_\xff\xfe " + str(a).encode() + b"\n")
    report = validate_set(set_dir)
    _, _, rows = read_outputs(set_dir)
    assert (report["input_entries"], report["accepted"], report["rejected"]) == (2, 1, 1)
    assert [(Path(r["file"]).name, r["line"], r["reason"]) for r in rows] == [("wav.scp", "2", "non_utf8")]


def strict_set(bad_dir: Path, set_dir: Path) -> Path:
    """wav.scp lines: 1 good, 2 missing file, 3 good, 4 missing file."""
    a, b = bad_dir / "audio" / "ok_8k_a.wav", bad_dir / "audio" / "ok_8k_b.wav"
    gone, gone2 = str(a.parent / "gone.wav"), str(a.parent / "gone2.wav")
    return write_small_set(set_dir, [("spk1_a", str(a), "zero"), ("spk1_b", gone, "one"),
                                     ("spk1_c", str(b), "two"), ("spk1_d", gone2, "x")])


def test_strict_raises_on_the_first_bad_line(bad_dir: Path, tmp_path: Path) -> None:
    set_dir = strict_set(bad_dir, tmp_path / "s")
    with pytest.raises(BadInputError) as err:
        validate_set(set_dir, strict=True)
    m = STRICT_MESSAGE.fullmatch(str(err.value))
    assert m, str(err.value)
    got = (Path(m["file"]).name, m["line"], m["key"], m["reason"])
    assert got == ("wav.scp", "2", "spk1_b", "missing_file")
    assert m["detail"].strip()


def test_strict_on_every_bad_kind_names_a_real_rejection(bad_dir: Path, default_run: tuple,
                                                         tmp_path: Path) -> None:
    set_dir = fresh_set(bad_dir, tmp_path / "train")
    with pytest.raises(BadInputError) as err:
        validate_set(set_dir, strict=True)
    m = STRICT_MESSAGE.fullmatch(str(err.value))
    assert m, str(err.value)
    rows = {(Path(r["file"]).name, r["line"], r["key"], r["reason"]) for r in default_run[3]}
    assert (Path(m["file"]).name, m["line"], m["key"], m["reason"]) in rows


def test_cli_exit_codes(bad_dir: Path, tmp_path: Path) -> None:
    strict_dir = strict_set(bad_dir, tmp_path / "strict")
    done = cli("--set-dir", str(strict_dir), "--language", "en", "--strict", "true")
    assert done.returncode == 2, done.stderr
    assert "wav.scp:2: spk1_b: missing_file: " in done.stderr and "Traceback" not in done.stderr
    done = cli("--set-dir", str(strict_dir), "--language", "en", "--strict", "false", "--nj", "2")
    assert done.returncode == 0, done.stderr
    assert json.loads((strict_dir / "report.json").read_text())["accepted"] == 2

    full = fresh_set(bad_dir, tmp_path / "train")
    done = cli("--set-dir", str(full), "--language", "en", "--emotion", "NEUTRAL", "--event", "Speech",
               "--itn", "woitn", "--allow-pipes", "true", "--max-duration", "60")
    assert done.returncode == 0, done.stderr
    report = json.loads((full / "report.json").read_text())
    assert report["accepted"] == sum(r == "ok" for r in (mbk.EXPECTED | mbk.WITH_PIPES_ALLOWED).values())


def test_cli_fails_clearly_when_every_utterance_is_rejected(bad_dir: Path, tmp_path: Path) -> None:
    a = bad_dir / "audio" / "ok_8k_a.wav"
    set_dir = write_small_set(tmp_path / "s", [("spk1_a", str(a.parent / "gone.wav"), "zero"),
                                               ("spk1_b", str(a), " ")])
    done = cli("--set-dir", str(set_dir), "--language", "en")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "rejected.tsv" in done.stderr or str(set_dir) in done.stderr, done.stderr
    _, jsonl, rows = read_outputs(set_dir)
    assert not jsonl and sorted(r["reason"] for r in rows) == ["empty_transcript", "missing_file"]
