"""funasr_recipe.data.kaldi_table (parsing, line ends, disk-sorted streams) and the validator on unsorted or
odd Kaldi files. Reads the bundled digit corpus's wavs; writes only under pytest's tmp_path."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

from funasr_recipe.data.kaldi_table import (
    count_lines,
    has_control_chars,
    iter_lines,
    parse_line,
    read_table,
    sorted_records,
)
from funasr_recipe.data.validate import validate_set

ROOT = Path(__file__).resolve().parents[3]
WAVS = sorted((ROOT / "corpora" / "free-spoken-digit-dataset" / "recordings").glob("*.wav"))


def small_set(set_dir: Path, n: int, order: list[int] | None = None, bom: bool = False) -> Path:
    if len(WAVS) < n:
        pytest.skip("the bundled corpus is missing")
    set_dir.mkdir(parents=True)
    order = order or list(range(n))
    lines = {name: [] for name in ("wav.scp", "text", "utt2spk")}
    for i in order:
        key = f"spk{i % 3}-utt{i:03d}"
        lines["wav.scp"].append(f"{key} {WAVS[i]}\n")
        lines["text"].append(f"{key} WORD{i}\n")
        lines["utt2spk"].append(f"{key} spk{i % 3}\n")
    for name, rows in lines.items():
        data = "".join(rows).encode()
        (set_dir / name).write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    return set_dir


def test_parse_line() -> None:
    assert parse_line(b"k1  a path with  spaces.wav \r\n", 3).value == "a path with  spaces.wav"
    assert parse_line(b"   \n", 1) is None
    assert parse_line(b"k2\n", 1).value == ""
    rec = parse_line(b"k3 caf\xe9\n", 7)
    assert (rec.key, rec.lineno, rec.error) == ("k3", 7, "non_utf8")
    assert parse_line(b"k4 one\x07two\n", 1).error == "control_chars"
    assert parse_line("k5 é ü 你好\n".encode(), 1).error is None
    assert has_control_chars("a\u200bb")
    assert not has_control_chars("a\tb") and not has_control_chars("a\u200db")


def test_sorted_records_sorts_by_key_then_line(tmp_path: Path) -> None:
    src = tmp_path / "text"
    src.write_bytes("b 1\na 2\n\nb 3\né 4\nA 5\n".encode())
    blank: list[int] = []
    recs = list(sorted_records(src, tmp_path, blank))
    assert [(r.key, r.lineno) for r in recs] == [("A", 6), ("a", 2), ("b", 1), ("b", 4), ("é", 5)]
    assert blank == [3]
    assert sorted(r.key for r in recs) == [r.key for r in recs]  # C-locale order == Python str order


def test_unsorted_input_gives_the_same_sorted_output(tmp_path: Path) -> None:
    order = list(range(30))
    random.Random(0).shuffle(order)
    a = validate_set(small_set(tmp_path / "sorted", 30))
    b = validate_set(small_set(tmp_path / "shuffled", 30, order))
    assert a["accepted"] == b["accepted"] == 30
    # "\n" only, as every JSONL reader must: str.splitlines() also splits at U+2028 in a key
    out_a = (tmp_path / "sorted" / "data.jsonl").read_text(encoding="utf-8").split("\n")[:-1]
    out_b = (tmp_path / "shuffled" / "data.jsonl").read_text(encoding="utf-8").split("\n")[:-1]
    keys = [json.loads(x)["key"] for x in out_a]
    assert out_a == out_b and keys == sorted(keys)


@pytest.mark.parametrize("block", [1, 2, 3, 5, 1 << 20])
def test_cr_lf_and_crlf_each_end_one_line_across_blocks(block: int) -> None:
    data = b"a 1\r\nb 2\rc 3\n\rd 4\r\r\ne 5"
    assert list(iter_lines(io.BytesIO(data), block)) == [b"a 1\r\n", b"b 2\r", b"c 3\n", b"\r", b"d 4\r",
                                                          b"\r\n", b"e 5"]


def test_read_table_and_count_lines_on_old_mac_line_ends(tmp_path: Path) -> None:
    src = tmp_path / "text"
    src.write_bytes(b"\xef\xbb\xbfk1 one\rk2 two\r\rk3 three\r")
    assert read_table(src) == [("k1", "one"), ("k2", "two"), ("k3", "three")]
    assert count_lines(src) == 4
    assert [(r.key, r.lineno) for r in sorted_records(src, tmp_path)] == [("k1", 1), ("k2", 2), ("k3", 4)]


def test_utf8_bom_on_the_first_line_is_not_part_of_the_key(tmp_path: Path) -> None:
    report = validate_set(small_set(tmp_path / "s", 5, bom=True))
    assert (report["accepted"], report["rejected"]) == (5, 0)


def test_key_missing_from_existing_utt2spk_is_rejected(tmp_path: Path) -> None:
    set_dir = small_set(tmp_path / "s", 4)
    lines = (set_dir / "utt2spk").read_text().splitlines(keepends=True)
    (set_dir / "utt2spk").write_text("".join(lines[1:]))
    report = validate_set(set_dir)
    assert (report["accepted"], report["rejected_by_reason"]) == (3, {"missing_in_utt2spk": 1})
    row = (set_dir / "rejected.tsv").read_text().splitlines()[1].split("\t")
    assert row[1:4] == ["1", "spk0-utt000", "missing_in_utt2spk"]


@pytest.mark.parametrize("missing", ["wav.scp", "text"])
def test_a_set_without_wav_scp_or_text_fails_naming_the_file(tmp_path: Path, missing: str) -> None:
    set_dir = small_set(tmp_path / "s", 2)
    (set_dir / missing).unlink()
    with pytest.raises(FileNotFoundError, match=f"{set_dir / missing} is missing"):
        validate_set(set_dir)


def test_an_empty_set_is_reported_not_crashed(tmp_path: Path) -> None:
    set_dir = small_set(tmp_path / "s", 1)
    for name in ("wav.scp", "text", "utt2spk"):
        (set_dir / name).write_bytes(b"")
    report = validate_set(set_dir)
    assert (report["input_entries"], report["accepted"], report["rejected"]) == (0, 0, 0)
