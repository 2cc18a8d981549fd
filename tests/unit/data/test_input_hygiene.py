"""Stage 0 and the recipes against input that looks fine and is not: derived-key clashes, clips too short
for a frame, files the user may not read, pipes that hang, byte-order marks, CR line ends, U+2028 in
keys, and one utterance in two sets.

Reads real wavs of corpora/free-spoken-digit-dataset/recordings (skips without them); writes only under
pytest's tmp_path. Permission tests drop root's file-mode override with setpriv (chmod 000 does not deny
root's reads) and skip where that is not possible.

  python -m pytest -x -q tests/unit/data/test_input_hygiene.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import soundfile as sf
from onnx import TensorProto, helper

from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.data.overlap import find_overlaps
from funasr_recipe.data.validate import MIN_DURATION_S, validate_set
from funasr_recipe.features import audio
from funasr_recipe.features.audio import AudioError, run_pipe
from funasr_recipe.packaging.package import write_trt
from recipes.kaldi.prepare import prepare as prepare_kaldi

ROOT = Path(__file__).resolve().parents[3]
WAV_DIR = ROOT / "corpora" / "free-spoken-digit-dataset" / "recordings"
BOM = b"\xef\xbb\xbf"
CLI_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    """Real speech samples (int16) of the bundled digit corpus."""
    wavs = sorted(WAV_DIR.glob("*.wav"))
    if not wavs:
        pytest.skip(f"{WAV_DIR} has no wavs (the bundled corpus is missing)")
    return np.concatenate([sf.read(str(w), dtype="int16")[0] for w in wavs[:3]])


def wav(path: Path, speech: np.ndarray, n: int, rate: int = 16000, offset: int = 0) -> Path:
    """n real samples (from ``offset`` on, repeated as needed) at ``rate``, written as a PCM_16 wav."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.resize(speech[offset:], n), rate, subtype="PCM_16")
    return path


def kaldi_set(set_dir: Path, rows: list[tuple[str, str, str]], end: str = "\n", bom: bool = False,
              spk: bool = False) -> Path:
    """wav.scp and text (and utt2spk, speaker = key up to its first '-') of (key, audio, transcript)."""
    set_dir.mkdir(parents=True, exist_ok=True)
    tables = {"wav.scp": [(k, a) for k, a, _ in rows], "text": [(k, t) for k, _, t in rows]}
    if spk:
        tables["utt2spk"] = [(k, k.split("-")[0]) for k, _, _ in rows]
    for name, pairs in tables.items():
        data = "".join(f"{k} {v}{end}" for k, v in pairs).encode()
        (set_dir / name).write_bytes((BOM if bom else b"") + data)
    return set_dir


def outcome(set_dir: Path) -> dict[str, tuple[str, str, str]]:
    """key -> (reason or "ok", line, detail) after validation."""
    rows = (set_dir / "rejected.tsv").read_text(encoding="utf-8").split("\n")[1:-1]
    got = {r[2]: (r[3], r[1], r[4]) for r in (row.split("\t", 4) for row in rows)}
    return got | {obj["key"]: ("ok", "", "") for _, obj in iter_jsonl(set_dir / "data.jsonl")}


def cli(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*prefix, sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S)


# 1. A key that stage 1 would give a speed-perturbed copy.

def test_derived_key_clash_is_rejected(tmp_path: Path, speech: np.ndarray) -> None:
    a = str(wav(tmp_path / "a.wav", speech, 8000))
    keys = ["spk1-x", "sp0.9-spk1-x", "sp1.1-spk1-x", "sp0.9-spk1-gone", "sp-spk1-x", "spk1-y"]
    set_dir = kaldi_set(tmp_path / "s", [(k, a, "ONE") for k in keys])
    report = validate_set(set_dir)
    got = outcome(set_dir)
    assert {k: v[0] for k, v in got.items()} == {
        "spk1-x": "ok", "sp0.9-spk1-x": "derived_key_clash", "sp1.1-spk1-x": "derived_key_clash",
        "sp0.9-spk1-gone": "ok", "sp-spk1-x": "ok", "spk1-y": "ok"}
    assert (got["sp0.9-spk1-x"][1], got["sp1.1-spk1-x"][1]) == ("2", "3")  # wav.scp lines
    assert "'spk1-x'" in got["sp0.9-spk1-x"][2] and "rename" in got["sp0.9-spk1-x"][2]
    assert report["rejected_by_reason"] == {"derived_key_clash": 2}


# 2. Audio too short to give one fbank frame.

def test_audio_under_10ms_is_too_short_and_10ms_is_kept(tmp_path: Path, speech: np.ndarray) -> None:
    cases = {"s-one": (1, 16000), "s-159": (159, 16000), "s-160": (160, 16000), "s-8k80": (80, 8000),
             "s-20ms": (320, 16000), "s-79": (79, 8000)}
    rows = [(k, str(wav(tmp_path / f"{k}.wav", speech, n, rate)), "A") for k, (n, rate) in cases.items()]
    set_dir = kaldi_set(tmp_path / "s", rows)
    validate_set(set_dir)
    got = outcome(set_dir)
    assert {k: v[0] for k, v in got.items()} == {"s-one": "too_short", "s-159": "too_short",
                                                "s-79": "too_short", "s-160": "ok", "s-8k80": "ok",
                                                "s-20ms": "ok"}
    assert MIN_DURATION_S == 0.01 and "1 samples at 16000 Hz" in got["s-one"][2]


# 3. Files the user may not read.

def unprivileged(tmp_path: Path) -> tuple[str, ...]:
    """A command prefix under which chmod 000 denies reads (none for a normal user; for root, setpriv
    dropping the capabilities that override file modes); skips where neither works."""
    if os.geteuid() != 0:
        return ()
    prefix = (shutil.which("setpriv") or "setpriv", "--bounding-set=-dac_override,-dac_read_search")
    probe = tmp_path / "probe"
    probe.write_bytes(b"x")
    probe.chmod(0)
    try:
        denied = subprocess.run([*prefix, "cat", str(probe)], capture_output=True, timeout=10).returncode != 0
    except OSError:
        denied = False
    if not denied:
        pytest.skip("running as root, and setpriv cannot drop CAP_DAC_OVERRIDE here: chmod 000 denies "
                    "root nothing")
    return prefix


def test_audio_the_user_may_not_read_is_permission_denied(tmp_path: Path, speech: np.ndarray) -> None:
    prefix = unprivileged(tmp_path)
    ok = wav(tmp_path / "ok.wav", speech, 4000)
    locked = wav(tmp_path / "locked.wav", speech, 4000)
    shut = wav(tmp_path / "shut" / "in.wav", speech, 4000)
    set_dir = kaldi_set(tmp_path / "s", [("s-ok", str(ok), "A"), ("s-locked", str(locked), "B"),
                                         ("s-shut", str(shut), "C")])
    locked.chmod(0)
    shut.parent.chmod(0)
    try:
        done = cli("-m", "local.prepare_data", "--set-dir", str(set_dir), prefix=prefix)
        assert done.returncode == 0, done.stderr
        code = ("import sys, json\nfrom funasr_recipe.features.audio import AudioError, load_audio\n"
                "try:\n    load_audio(sys.argv[1])\n"
                "except AudioError as e:\n    print(json.dumps([e.reason, e.detail]))")
        loaded = cli("-c", code, str(locked), prefix=prefix)
    finally:
        shut.parent.chmod(0o755)
        locked.chmod(0o644)
    got = outcome(set_dir)
    assert got["s-ok"][0] == "ok"
    assert got["s-locked"] == ("permission_denied", "2", f"permission denied: {locked}")
    assert got["s-shut"] == ("permission_denied", "3", f"permission denied: {shut}")
    assert json.loads(loaded.stdout) == ["permission_denied", f"permission denied: {locked}"], loaded.stderr


@pytest.mark.parametrize("table", ["text", "utt2spk"])
def test_a_table_the_user_may_not_read_fails_naming_it(tmp_path: Path, speech: np.ndarray,
                                                       table: str) -> None:
    prefix = unprivileged(tmp_path)
    a = str(wav(tmp_path / "a.wav", speech, 4000))
    corpus = kaldi_set(tmp_path / "one", [(f"spk{i}-u", a, "A") for i in range(3)], spk=True)
    (corpus / table).chmod(0)
    try:
        checks = [cli("-m", "local.prepare_data", "--set-dir", str(corpus), prefix=prefix),
                  cli("-m", "recipes.kaldi.prepare", "--corpus-dir", str(corpus), "--data-dir",
                      str(tmp_path / "data"), prefix=prefix)]
    finally:
        (corpus / table).chmod(0o644)
    for done in checks:
        assert done.returncode == 2, done.stderr
        assert f"{corpus / table}: permission denied" in done.stderr and "Traceback" not in done.stderr


def test_a_set_dir_the_user_may_not_enter_is_not_called_missing(tmp_path: Path, speech: np.ndarray) -> None:
    prefix = unprivileged(tmp_path)
    set_dir = kaldi_set(tmp_path / "s", [("s-a", str(wav(tmp_path / "a.wav", speech, 4000)), "A")])
    set_dir.chmod(0o600)  # listable, not enterable
    try:
        done = cli("-m", "local.prepare_data", "--set-dir", str(set_dir), prefix=prefix)
    finally:
        set_dir.chmod(0o755)
    assert done.returncode == 2 and f"{set_dir / 'wav.scp'}: permission denied" in done.stderr, done.stderr
    assert "is missing" not in done.stderr and "Traceback" not in done.stderr


# 4. A pipe that hangs: the whole process group goes.

def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


@pytest.mark.timeout(60)
def test_pipe_timeout_kills_the_pipes_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "child.pid"
    monkeypatch.setattr(audio, "PIPE_TIMEOUT_S", 1)
    # The inner shell and its child do not hold the pipe's stdout, so that the old code's read returned
    # (and left them running) instead of waiting 600 s for them.
    source = f"sh -c 'sleep 600 & echo $! > {pid_file}; wait' >/dev/null 2>&1 |"
    pid = None
    try:
        with pytest.raises(AudioError) as err:
            run_pipe(source)
        assert err.value.reason == "pipe_failed" and "ran over 1s" in err.value.detail
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"the pipe's child {pid} is still running"
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)  # the sleep this test started


# 5, 6. Byte-order marks and CR line ends (Windows, old Mac editors) in one data dir split by speaker.

@pytest.mark.parametrize(("bom", "end"), [(True, "\n"), (True, "\r\n"), (False, "\r")])
def test_single_dir_with_bom_or_cr_splits_and_validates(tmp_path: Path, speech: np.ndarray, bom: bool,
                                                        end: str) -> None:
    utts = [f"spk{s}-u{j}" for s in range(3) for j in range(2)]
    rows = [(u, str(wav(tmp_path / "audio" / f"{u}.wav", speech, 4000, offset=100 * i)), "WORDS")
            for i, u in enumerate(utts)]
    corpus = kaldi_set(tmp_path / "one", rows, end=end, bom=bom)
    # utt2spk in another order than wav.scp: its first key (the one with the mark) is not theirs
    (corpus / "utt2spk").write_bytes((BOM if bom else b"") + "".join(f"{u} {u[:4]}{end}"
                                                                     for u in reversed(utts)).encode())
    prepare_kaldi(corpus, tmp_path / "data", dev_speakers=2)
    accepted = {}
    for name in ("train", "dev"):
        report = validate_set(tmp_path / "data" / name)
        assert report["rejected"] == 0, outcome(tmp_path / "data" / name)
        accepted[name] = {k for k, (r, _, _) in outcome(tmp_path / "data" / name).items() if r == "ok"}
        assert BOM not in (tmp_path / "data" / name / "spk2utt").read_bytes()
    assert accepted == {"dev": {u for u in utts if u[:4] in ("spk0", "spk2")},
                        "train": {"spk1-u0", "spk1-u1"}}


def test_cr_line_ends_keep_line_numbers(tmp_path: Path, speech: np.ndarray) -> None:
    rows = [(f"s-{i}", str(wav(tmp_path / f"{i}.wav", speech, 4000)), "A") for i in range(4)]
    set_dir = kaldi_set(tmp_path / "s", rows, end="\r")
    (set_dir / "text").write_bytes(b"s-0 A\r\ns-1 A\rs-2 \ns-3 A")  # every line end, the last line bare
    report = validate_set(set_dir)
    assert (report["accepted"], outcome(set_dir)["s-2"][:2]) == (3, ("empty_transcript", "3"))


# 7. U+2028/U+2029 in a key: JSON Lines are split at "\n" only.

def tiny_onnx(path: Path) -> None:
    """An ONNX model with a speech input of dynamic batch and time axes (what write_trt reads)."""
    x = helper.make_tensor_value_info("speech", TensorProto.FLOAT, ["batch", "time", 560])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "time", 560])
    graph = helper.make_graph([helper.make_node("Identity", ["speech"], ["out"])], "tiny", [x], [y])
    path.parent.mkdir(parents=True)
    onnx.save(helper.make_model(graph), str(path))


def test_line_separator_in_a_key_survives_jsonl(tmp_path: Path, speech: np.ndarray) -> None:
    keys = ["s-a\u2028b", "s-c\u2029d", "s-e"]
    rows = [(k, str(wav(tmp_path / f"{i}.wav", speech, 16000 * (i + 1))), "ONE\u2028TWO") for i, k in
            enumerate(keys)]
    set_dir = kaldi_set(tmp_path / "data" / "dev", rows)
    assert validate_set(set_dir)["accepted"] == 3
    assert [obj["key"] for _, obj in iter_jsonl(set_dir / "data.jsonl")] == keys
    tiny_onnx(tmp_path / "pkg" / "onnx" / "model.onnx")
    trt = write_trt(tmp_path / "pkg", set_dir / "data.jsonl", 4, 30.0)
    assert trt["seconds"][1] == 2.0  # the median of 1, 2 and 3 s: every line read, none split


def test_jsonl_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(BOM + b'{"key": "a"}\n{"key": "b"}\n')
    assert [obj["key"] for _, obj in iter_jsonl(path)] == ["a", "b"]


# 8. One utterance in two sets.

def jsonl_set(data_dir: Path, name: str, rows: list[tuple[str, str]]) -> None:
    (data_dir / name).mkdir(parents=True)
    lines = [json.dumps({"key": k, "source": s}, ensure_ascii=False) + "\n" for k, s in rows]
    (data_dir / name / "data.jsonl").write_text("".join(lines), encoding="utf-8")


@pytest.fixture
def overlapping(tmp_path: Path, speech: np.ndarray) -> Path:
    """train, dev (one key of train's, two of its audio files by other names) and test (disjoint)."""
    a, b, c, d, e = (wav(tmp_path / "audio" / f"{n}.wav", speech, 4000, offset=50 * i)
                     for i, n in enumerate("abcde"))
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "b.wav").symlink_to(b)
    data = tmp_path / "data"
    jsonl_set(data, "train", [("t-a", str(a)), ("t-b", str(b)), ("t-c", str(c))])
    jsonl_set(data, "dev", [("t-a", str(d)), ("d-b", str(tmp_path / "links" / "b.wav")),
                            ("d-c", str(tmp_path / "links" / ".." / "audio" / "c.wav")),
                            ("d-p", f"cat {c} |"), ("d-d", str(d))])
    jsonl_set(data, "test", [("x-e", str(e))])
    return data


def test_find_overlaps_by_key_and_by_real_path(overlapping: Path) -> None:
    counts = find_overlaps(overlapping, ["train", "dev", "test"])
    assert counts == {"train/dev": {"key": 1, "audio": 2}, "train/test": {"key": 0, "audio": 0},
                      "dev/test": {"key": 0, "audio": 0}}
    rows = [r.split("\t") for r in (overlapping / "overlap.tsv").read_text(encoding="utf-8").split("\n")[:-1]]
    assert rows[0] == ["set_a", "set_b", "kind", "key_a", "key_b", "source"]
    assert [r[:5] for r in rows[1:]] == [["train", "dev", "key", "t-a", "t-a"],
                                        ["train", "dev", "audio", "t-b", "d-b"],
                                        ["train", "dev", "audio", "t-c", "d-c"]]
    with pytest.raises(FileNotFoundError, match="eval"):
        find_overlaps(overlapping, ["train", "eval"])


def test_overlap_cli_warns_fails_when_strict_and_says_none(overlapping: Path) -> None:
    args = ("-m", "local.prepare_data", "--overlap", "--data-dir", str(overlapping))
    done = cli(*args, "--sets", "train dev test", "--strict", "false")
    assert done.returncode == 0, done.stderr
    warning = next(line for line in done.stderr.splitlines() if "WARNING" in line)
    for words in ("3 utterances are in two sets", "1 by the same key", "2 by the same audio file",
                  str(overlapping / "overlap.tsv"), "--strict true"):
        assert words in warning, warning
    strict = cli(*args, "--sets", "train,dev", "--strict", "true")
    assert strict.returncode == 2 and "3 utterances" in strict.stderr and "Traceback" not in strict.stderr
    clean = cli(*args, "--sets", "train test", "--strict", "true")
    assert clean.returncode == 0 and "INFO" in clean.stderr and "no utterance is in two" in clean.stderr
    assert (overlapping / "overlap.tsv").read_text() == "set_a\tset_b\tkind\tkey_a\tkey_b\tsource\n"
    assert cli(*args).returncode == 2  # --overlap without --sets is a usage error
