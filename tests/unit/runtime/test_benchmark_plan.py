"""Stage 5's benchmark plan (runtime/benchmark.py) with stand-in runners: the set spread over the data.jsonl,
latency timed on at most LATENCY_CALLS batches spread over it, throughput of whole-set calls in turns
whose order reverses every other round, texts compared on the whole set.

  .venv/bin/python -m pytest tests/unit/runtime/test_benchmark_plan.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf

from funasr_recipe.runtime import benchmark
from funasr_recipe.runtime.benchmark import LATENCY_CALLS, benchmark_set, measure, measure_stream, spread


def test_spread_takes_evenly_spaced_items_from_the_first() -> None:
    assert spread(list(range(10)), 4) == [0, 2, 5, 7]
    assert spread(list(range(10)), None) == spread(list(range(10)), 10) == spread(list(range(10)), 50) \
        == list(range(10))


def test_the_set_is_spread_over_a_sorted_data_jsonl(tmp_path: Path) -> None:
    lines = []
    for digit in range(10):  # sorted by digit, as the demo's dev set: its first lines are one digit
        for take in range(3):
            path = tmp_path / f"{digit}_{take}.wav"
            sf.write(path, np.zeros(800 * (digit + 1), dtype=np.float32), 8000)
            lines.append({"key": f"{digit}_{take}", "source": str(path), "target": str(digit)})
    (tmp_path / "bad.wav").write_bytes(b"not audio")
    lines.insert(15, {"key": "bad", "source": str(tmp_path / "bad.wav"), "target": "x"})
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    utts, seconds = benchmark_set(jsonl, 10)
    # Lines 0, 3, 6, ... 27 of 31 (i * 31 // 10): line 15, the unreadable file, is left out, not replaced.
    picked = [lines[i]["key"] for i in range(0, 30, 3) if i != 15]
    assert [u["key"] for u in utts] == picked and {k[0] for k in picked} == set("012345678")
    assert seconds == sum(u["seconds"] for u in utts) and utts[-1]["seconds"] > utts[0]["seconds"]


class Recorder:
    """A runner that records its calls; its texts are the keys, upper-cased."""

    def __init__(self, name: str, log: list[tuple[str, int]]) -> None:
        self.name, self.log = name, log

    def __call__(self, paths: list[str], keys: list[str], batch: int) -> list[str]:
        self.log.append((self.name, len(paths)))
        return [k.upper() for k in keys]


def test_latency_is_timed_on_a_spread_sample_and_throughput_on_whole_sets_in_turns(monkeypatch) -> None:
    monkeypatch.setattr(benchmark, "SETTLE_S", 0.0)
    log: list[tuple[str, int]] = []
    loaded = [(name, "fp32", Recorder(name, log)) for name in ("a", "b", "c")]
    utts = [{"key": f"u{i:03d}", "source": f"/x/{i}.wav"} for i in range(100)]
    latencies = measure(loaded, utts, 1, repeats=1)
    assert [len(x) for x in latencies] == [LATENCY_CALLS] * 3  # not 100 calls each
    assert len(measure(loaded, utts, 8, repeats=2)[0]) == 2 * 13  # 13 batches of 8: all of them
    log.clear()
    stream = measure_stream(loaded, utts, 8, rounds=4)
    assert [name for name, _ in log] == list("abc" "cba" "abc" "cba") and {n for _, n in log} == {100}
    assert all(seconds >= 0 and texts == [u["key"].upper() for u in utts] for seconds, texts in stream)


def _report(**extra: object) -> dict:
    rows = [{"runtime": rt, "label": rt, "precision": p, "device": "cpu", "batch": b,
             "latency_ms": {"p50": 10.0, "p95": 12.0}, "utt_per_s": ups, "rtf": 0.01,
             "speedup_vs_pytorch": ups / 10.0, "same_text_as_pytorch": 1.0}
            for rt, p, b, ups in (("pytorch", "fp32", 1, 10.0), ("ours", "fp32", 1, 20.0),
                                  ("pytorch", "fp32", 8, 10.0), ("ours", "int8", 8, 40.0))]
    return {"tag": "tiny_sensevoice", "family": "SenseVoiceSmall", "utterances": 4, "data_jsonl": "d.jsonl",
            "audio_seconds": 4.0, "threads": 2, "funasr_onnx": None, "versions": {}, "notes": ["a note"],
            "machine": {"cpu": "cpu", "cores_available": 2, "load_before": [0.5], "load_after": [0.5]},
            "rows": rows, **extra}


def test_the_report_judges_the_benchmarks_targets_only_when_it_has_them() -> None:
    """Stage 5's report is the user's table; the recipe's performance targets are bench_runtime's."""
    plain = benchmark.markdown(_report())
    assert "Targets" not in plain and "MISSED" not in plain and "target" not in plain
    assert plain.count("\n| ") == 1 + 4 and "- note: a note" in plain
    judged = benchmark.targets(_report()["rows"])
    assert [t["ok"] for t in judged] == [False, True]  # 2.0x < 2.5x; 4.0x >= 3x
    text = benchmark.markdown(_report(targets=judged))
    assert "(target >= 2.5x): **MISSED**" in text and "(target >= 3.0x): **ok**" in text
