"""Stage 1's shard checksums (issue #30): flipped or truncated shard bytes are found, named and recomputed.

Writes a few tone clips and their stage-0 data.jsonl under pytest's tmp paths, computes real shards with
features/dump.py (4 training shards, 1 dev shard), damages one, then runs ``local.compute_fbank verify``,
stage 1's resume, its merge and data/local_cache.py's copy on it.

  .venv/bin/python -m pytest tests/unit/features/test_shard_sums.py -q
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from funasr_recipe.core.cli import StageFailed
from funasr_recipe.core.log import setup_logging
from funasr_recipe.data.local_cache import fill
from funasr_recipe.data.manifest import manifest_line
from funasr_recipe.dist.markers import mark_done, read_fingerprint
from funasr_recipe.features.audio import probe_audio
from funasr_recipe.features.dump import SetPlan, compute_shards, merge_set, plan_sets
from funasr_recipe.features.fbank_conf import FbankConf
from funasr_recipe.features.shard_sums import SHARD_FILES, file_sum
from local import compute_fbank

TAGS = {"language": "<|en|>", "emotion": "<|NEUTRAL|>", "event": "<|Speech|>"}
CONF = FbankConf()
SETS = {"train": 8, "dev": 2}


def write_data(root: Path) -> None:
    """Stage 0's data.jsonl of short tones in noise, one per utterance."""
    for name, n in SETS.items():
        (root / "data" / name).mkdir(parents=True)
        lines = []
        for i in range(n):
            rate = 16000
            t = np.arange(int(0.3 * rate)) / rate
            noise = np.random.default_rng(i).standard_normal(t.size)
            x = 0.3 * np.sin(2 * np.pi * (200 + 40 * i) * t) + 0.05 * noise
            wav = root / "data" / name / f"u{i}.wav"
            sf.write(wav, x.astype(np.float32), rate, subtype="PCM_16")
            lines.append(manifest_line(f"{name}-{i}", str(wav), probe_audio(str(wav)), f"WORD{i}", TAGS,
                                       "<|woitn|>", "spk"))
        (root / "data" / name / "data.jsonl").write_text("".join(lines), encoding="utf-8")


def plans(root: Path) -> list[SetPlan]:
    return plan_sets(root / "data", root / "dump", list(SETS), "train", "1.0", 2, CONF)


def stage1(root: Path) -> list[SetPlan]:
    """compute_fbank's work and merge (no tokenizer): what run.sh's stage 1 runs, then its .done."""
    sets = plans(root)
    compute_shards(sets, CONF, 0, 1, strict=False)
    for plan in sets:
        merge_set(plan, CONF, 1, timeout=5)
    mark_done(root / "dump" / ".done", "stage-1-fp")
    return sets


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    setup_logging()  # to this test's stderr (capfd), not an earlier test's
    write_data(tmp_path)
    stage1(tmp_path)
    return tmp_path / "dump"


def shard(dump: Path, name: str = "train", i: int = 1, suffix: str = "ark") -> Path:
    return dump / name / "shards" / f"{i:05d}.{suffix}"


def flip_64_bytes(path: Path) -> None:
    """64 bytes in the middle inverted, the file's size and modification time as they were."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)


def verify(dump: Path, *extra: str) -> int:
    return compute_fbank.main(["verify", "--dump-dir", str(dump), "--sets", "train dev", *extra])


def snapshot(dump: Path) -> dict[str, bytes]:
    """Every shard's ark/scp/jsonl and each set's data.jsonl and feats.scp, by bytes."""
    files = [*dump.glob("*/shards/*.ark"), *dump.glob("*/shards/*.scp"), *dump.glob("*/shards/*.jsonl"),
             *dump.glob("*/data.jsonl"), *dump.glob("*/feats.scp")]
    return {str(p.relative_to(dump)): p.read_bytes() for p in sorted(files)}


def failure_lines(err: str) -> list[str]:
    """The per-shard lines of verify's log (not its final summary)."""
    return [line for line in err.splitlines() if "does not match its record: " in line
            or "cannot be checked: " in line]


def test_each_shard_records_the_size_and_crc32_of_its_files(dump: Path) -> None:
    info = json.loads(shard(dump, suffix="done").read_text().splitlines()[2])
    assert set(info["files"]) == set(SHARD_FILES)
    assert info["files"]["ark"] == file_sum(shard(dump)) and info["files"]["ark"]["bytes"] > 0


def test_a_good_dump_verifies_clean(dump: Path, capfd: pytest.CaptureFixture) -> None:
    assert verify(dump) == 0
    err = capfd.readouterr().err
    assert failure_lines(err) == [] and "MB/s" in err and "5 shards" in err


def test_flipped_bytes_in_an_ark_are_found_and_the_shard_named(dump: Path,
                                                               capfd: pytest.CaptureFixture) -> None:
    ark = shard(dump)
    want = file_sum(ark)["crc32"]
    flip_64_bytes(ark)
    assert verify(dump) == 1
    err = capfd.readouterr().err
    lines = failure_lines(err)
    assert len(lines) == 1, err
    assert f"{ark}: crc32 {want} expected, {file_sum(ark)['crc32']} found" in lines[0]
    assert "rerun stage 1: it recomputes these shards" in err
    assert shard(dump, suffix="done").is_file() and (dump / ".done").is_file()  # no --repair: nothing removed


def test_a_truncated_ark_is_found_and_named_by_its_size(dump: Path, capfd: pytest.CaptureFixture) -> None:
    ark = shard(dump, "dev", 0)
    size = ark.stat().st_size
    truncate(ark)
    assert verify(dump) == 1
    lines = failure_lines(capfd.readouterr().err)
    assert len(lines) == 1 and f"{ark}: size {size} bytes expected, {size - 100} found" in lines[0]


def test_repair_then_stage1_recomputes_exactly_the_bad_shard_byte_for_byte(dump: Path) -> None:
    before = snapshot(dump)
    others = {p: p.stat().st_mtime_ns for p in dump.glob("*/shards/*.ark") if p != shard(dump)}
    flip_64_bytes(shard(dump))
    assert verify(dump, "--repair", "true") == 1
    # The bad shard's marker, its set's merged lists and the dump's .done go; the rest stays.
    assert not shard(dump, suffix="done").exists() and not (dump / ".done").exists()
    assert not (dump / "train" / "data.jsonl").exists() and (dump / "dev" / "data.jsonl").is_file()
    assert shard(dump, i=0, suffix="done").is_file()
    stage1(dump.parent)
    assert snapshot(dump) == before
    assert {p: p.stat().st_mtime_ns for p in others} == others  # only the bad shard was computed again
    assert verify(dump) == 0


def test_stage1_resume_recomputes_a_corrupted_shard_whose_done_matches(
        dump: Path, caplog: pytest.LogCaptureFixture) -> None:
    before = snapshot(dump)
    train = plans(dump.parent)[0]
    truncate(shard(dump, i=2))
    flip_64_bytes(shard(dump, i=3, suffix="jsonl"))
    assert train.shard_done(2) and train.shard_done(3)  # the markers alone would certify both again
    compute_shards(plans(dump.parent), CONF, 0, 1, strict=False)
    err = caplog.text
    assert "2 of its 4 shards to compute" in err and "recomputing it" in err
    assert snapshot(dump) == before


def test_merge_refuses_a_shard_that_fails_its_check(dump: Path) -> None:
    train = plans(dump.parent)[0]
    flip_64_bytes(shard(dump, i=0))
    with pytest.raises(StageFailed, match=r"(?s)00000\.ark: crc32 \w+ expected, \w+ found.*rerun stage 1"):
        merge_set(train, CONF, 1, timeout=5)
    assert not shard(dump, i=0, suffix="done").exists()  # the rerun recomputes it


def test_a_shard_without_a_record_is_unverifiable_and_repair_recomputes_it(
        dump: Path, capfd: pytest.CaptureFixture) -> None:
    """A shard made before checksums were recorded: its marker's summary has no "files"."""
    before = snapshot(dump)
    marker = shard(dump, "dev", 0, "done")
    fp, stamp, summary = marker.read_text().splitlines()
    old = {k: v for k, v in json.loads(summary).items() if k != "files"}
    marker.write_text(f"{fp}\n{stamp}\n{json.dumps(old)}\n")
    assert verify(dump) == 1
    lines = failure_lines(capfd.readouterr().err)
    assert len(lines) == 1 and "no checksum recorded (made by an older version of stage 1)" in lines[0]
    assert verify(dump, "--repair", "true") == 1 and read_fingerprint(marker) is None
    stage1(dump.parent)
    assert snapshot(dump) == before and verify(dump) == 0


def test_the_local_cache_checks_its_copy_against_stage1s_record(dump: Path, tmp_path: Path) -> None:
    assert fill(dump, tmp_path / "cache", ["train", "dev"], reserve_bytes=0).copied == 5
    flip_64_bytes(shard(dump, i=3))
    os.utime(shard(dump, i=3))  # a new mtime: the copy is made again, from the damaged source
    with pytest.raises(RuntimeError, match=r"00003\.ark: stage 1 recorded .* rerun stage 1"):
        fill(dump, tmp_path / "cache", ["train", "dev"], reserve_bytes=0)
