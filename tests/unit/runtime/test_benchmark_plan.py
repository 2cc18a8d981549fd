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
