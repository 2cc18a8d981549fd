"""bench/bench_feats_storage.py on a few bundled clips: the rows it reports (the timings are the lead's to
measure, alone on the machine; here only that each storage was written, read back and compared)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_feats_storage import main
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR


def test_each_storage_is_sized_read_and_compared(tmp_path: Path, capsys) -> None:
    clips = sorted(DEFAULT_WAV_DIR.glob("*.wav"))[:4]
    listing = tmp_path / "data.jsonl"
    listing.write_text("".join(json.dumps({"key": c.stem, "source": str(c)}) + "\n" for c in clips))
    out = tmp_path / "out.json"
    assert main(["--data-jsonl", str(listing), "--min-seconds", "0.01", "--out-json", str(out)]) == 0
    rows = {r["storage"]: r for r in json.loads(out.read_text())["rows"]}
    exact, half, cast = rows["float32"], rows["uint16"], rows["float16 (not offered)"]
    assert 0.49 < half["ark_bytes"] / exact["ark_bytes"] < 0.52
    assert 100 < exact["gb_per_1000h"] < 120  # 100 frames/s x 80 x 4 bytes = 115.2 GB, plus keys and headers
    assert exact["max_abs_error"] == 0 and 0 < half["max_abs_error"] < 1e-3 < cast["max_abs_error"]
    assert half["read_passes"] >= 1 and half["read_audio_s_per_cpu_s"] > 0
    assert "| uint16 | 2 |" in capsys.readouterr().out


def test_an_empty_list_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text("")
    assert main(["--data-jsonl", str(tmp_path / "data.jsonl")]) == 2
