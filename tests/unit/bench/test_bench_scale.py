"""bench/bench_scale.py: its synthetic inputs, its peak-memory wrapper and the fit it reports (the timed
runs are the lead's, alone on the machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.bench_scale import DIGITS, fit, report, run_timed, write_corpus, write_decode


def test_the_corpus_cycles_over_the_bundled_recordings_with_unique_speaker_keys(tmp_path: Path) -> None:
    write_corpus(tmp_path / "train", 3000)
    scp = [line.split() for line in (tmp_path / "train" / "wav.scp").read_text().splitlines()]
    text = [line.split(" ", 1) for line in (tmp_path / "train" / "text").read_text().splitlines()]
    assert len(scp) == len(text) == 3000 and len({k for k, _ in scp}) == 3000
    assert scp[0][1] == scp[2500][1] and scp[0][1] != scp[1][1]  # 2,500 recordings, reused in turn
    for (key, wav), (_, words) in zip(scp, text, strict=True):
        assert key.startswith(Path(wav).stem.split("_")[1] + "-")  # Kaldi: speaker-prefixed keys
        assert words == DIGITS[int(Path(wav).stem[0])]
    write_decode(tmp_path / "decode", 50)
    refs = (tmp_path / "decode" / "ref.txt").read_text().splitlines()
    hyps = (tmp_path / "decode" / "hyp.txt").read_text().splitlines()
    assert [r.split()[0] for r in refs] == [h.split()[0] for h in hyps] and refs != hyps


def test_a_childs_peak_is_its_own_not_the_parents(tmp_path: Path) -> None:
    hog = bytearray(300 << 20)  # this process: 300 MiB more than the child will ever hold
    hog[:: 1 << 12] = b"x" * len(hog[:: 1 << 12])
    wall, peak = run_timed("json.tool", ["--help"], tmp_path / "child.log")
    assert wall > 0 and 5 < peak < 150, peak
    with pytest.raises(RuntimeError, match="json.tool --no-such-option failed"):
        run_timed("json.tool", ["--no-such-option"], tmp_path / "bad.log")


def test_the_fit_separates_the_fixed_cost_and_projects_10m() -> None:
    fixed, per = fit([10_000, 100_000, 1_000_000], [3 + 2e-6 * n for n in (10_000, 100_000, 1_000_000)])
    assert fixed == pytest.approx(3) and per == pytest.approx(2e-6)
    startup = {"n": 1000, "index_s": 0.1, "index_resident_b": 700.0, "sampler_s": 0.01,
               "sampler_resident_b": 40.0, "funasr_sampler_epoch_s": 0.02, "skipped_check_s": 0.03}
    rows = [{"n": n, "steps": {"scoring": {"wall_s": 1 + n * 1e-5, "peak_mib": 20 + n * 1e-4}},
             "startup": {"IndexDSJsonl": {**startup, "n": n}}} for n in (1000, 2000)]
    text = report(rows)
    assert "| scoring (s) | 1.01 | 1.02 | 10.0 us | 1.0 | 101 |" in text
    assert "| start-up index, IndexDSJsonl (resident MiB) |" in text and "700.0 B" in text
