"""Benchmark stage 0 (funasr_recipe.data.validate.validate_set, what local/prepare_data.py runs) on the
bundled digit corpus.

Reads corpora/free-spoken-digit-dataset/recordings (2500 real wavs; nothing outside the repo); writes
two Kaldi data dirs under a temporary folder (or --work-dir): x1 (every recording once) and x10 (the
same recordings ten times under distinct keys), validates each with nj=1 and nj=--nj, and prints a
table and the ratios "peak memory x10 / x1" and "utt/s nj=N / nj=1", all measured in this one run
(--out-json writes the same numbers as JSON).

Every validation runs in a FRESH subprocess (this program with --child), so that its peak memory is
its own. Memory columns, from resource.getrusage inside that subprocess after validate_set returns:
  self MiB   ru_maxrss of RUSAGE_SELF: peak RSS of the validating process itself.
  child MiB  ru_maxrss of RUSAGE_CHILDREN: the peak RSS of the LARGEST single finished descendant (the
             kernel keeps a maximum here, not a sum): a probing worker of the pool, or a `sort`.
  peak MiB   self + child x max(nj, 1): an upper bound of the memory held at once by the validator and
             its nj workers (pages a forked worker shares with its parent are counted twice).
  tree MiB   the largest sum of PSS (shared pages split between the processes sharing them, so nothing
             is counted twice) over the subprocess and its descendants, sampled every 20 ms from outside
             with psutil: a measurement, which can miss a spike shorter than 20 ms.
Seconds are those of the validate_set call alone (no interpreter start-up or imports); every wav is read
once before the first run, so that no run pays for a cold page cache.

  .venv/bin/python -m bench.bench_prepare_data --nj 2 --out-json exp/bench_prepare_data.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from funasr_recipe.core.cli import program_parser

try:
    import psutil
except ImportError:  # the tree column is left empty
    psutil = None

ROOT = Path(__file__).resolve().parents[1]
WAV_DIR = ROOT / "corpora" / "free-spoken-digit-dataset" / "recordings"
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SCALES = (1, 10)
RUN_TIMEOUT_S = 900


def build_set(set_dir: Path, wavs: list[Path], repeats: int) -> int:
    """Write a Kaldi dir with every wav ``repeats`` times under keys ``<speaker>-r<rep>-<digit>-<index>``."""
    from recipes.common import Utt, write_kaldi_set

    utts = []
    for rep in range(repeats):
        for wav in wavs:
            digit, speaker, index = wav.stem.split("_")
            utts.append(Utt(key=f"{speaker}-r{rep:02d}-{digit}-{index}", path=str(wav.resolve()),
                            text=DIGITS[int(digit)], speaker=speaker))
    return write_kaldi_set(set_dir, utts)


def child(set_dir: Path, nj: int, result: Path) -> None:
    """Runs in the fresh subprocess: validate one set and write the measurements to ``result``."""
    from funasr_recipe.data.validate import validate_set

    baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    report = validate_set(set_dir, language="en", nj=nj)
    seconds = time.perf_counter() - start
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    child_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result.write_text(json.dumps({"seconds": seconds, "baseline_kib": baseline_kib, "self_kib": self_kib,
                                  "child_kib": child_kib, "accepted": report["accepted"],
                                  "input_entries": report["input_entries"]}))


def _tree_pss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except psutil.Error:  # a worker that just exited
            pass
    return total


def run_once(set_dir: Path, nj: int, work: Path) -> dict:
    """Validate set_dir with nj workers in a fresh subprocess; return its measurements (MiB, seconds)."""
    result = work / f"result.{set_dir.name}.nj{nj}.json"
    cmd = [sys.executable, "-m", "bench.bench_prepare_data", "--child", str(set_dir), "--nj", str(nj),
           "--result", str(result)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(work / f"log.{set_dir.name}.nj{nj}.txt", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        tree_peak = 0
        watched = psutil.Process(proc.pid) if psutil else None
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"{' '.join(cmd)} ran over {RUN_TIMEOUT_S} s (a stuck worker pool?)")
            if watched is not None:
                try:
                    tree_peak = max(tree_peak, _tree_pss(watched))
                except psutil.Error:
                    pass
            time.sleep(0.02)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}; see {log.name}:\n"
                           + Path(log.name).read_text()[-3000:])
    m = json.loads(result.read_text())
    mib = 1024.0
    out = {"set": set_dir.name, "nj": nj, "utterances": m["input_entries"], "accepted": m["accepted"],
           "seconds": round(m["seconds"], 3), "utt_per_s": round(m["input_entries"] / m["seconds"], 1),
           "baseline_mib": round(m["baseline_kib"] / mib, 1), "self_mib": round(m["self_kib"] / mib, 1),
           "child_mib": round(m["child_kib"] / mib, 1),
           "peak_mib": round((m["self_kib"] + m["child_kib"] * max(nj, 1)) / mib, 1),
           "tree_mib": round(tree_peak / 2**20, 1) if watched is not None else None,
           "data_jsonl_sha1": hashlib.sha1((set_dir / "data.jsonl").read_bytes()).hexdigest()}
    return out


def bench(nj: int, work: Path) -> dict:
    """Build the x1 and x10 sets, validate each with nj=1 and nj, and return the runs and ratios."""
    wavs = sorted(WAV_DIR.glob("*.wav"))
    if not wavs:
        raise SystemExit(f"bench_prepare_data: no wavs under {WAV_DIR}; the bundled corpus is missing")
    for wav in wavs:  # warm the page cache: the first run must not be the only one reading from disk
        wav.read_bytes()
    runs = []
    for scale in SCALES:
        set_dir = work / f"x{scale}"
        build_set(set_dir, wavs, scale)
        for n in sorted({1, nj}):
            runs.append(run_once(set_dir, n, work))
            print(f"  x{scale} nj={n}: {runs[-1]['seconds']} s", file=sys.stderr, flush=True)
    by = {(r["set"], r["nj"]): r for r in runs}
    lo, hi = f"x{SCALES[0]}", f"x{SCALES[-1]}"
    ratios = {}
    for n in sorted({1, nj}):
        ratios[f"peak_mib x10/x1 nj={n}"] = round(by[hi, n]["peak_mib"] / by[lo, n]["peak_mib"], 2)
        ratios[f"self_mib x10/x1 nj={n}"] = round(by[hi, n]["self_mib"] / by[lo, n]["self_mib"], 2)
        if by[hi, n]["tree_mib"] and by[lo, n]["tree_mib"]:
            ratios[f"tree_mib x10/x1 nj={n}"] = round(by[hi, n]["tree_mib"] / by[lo, n]["tree_mib"], 2)
    for scale in SCALES:
        s = f"x{scale}"
        ratios[f"utt/s nj={nj}/nj=1 {s}"] = round(by[s, nj]["utt_per_s"] / by[s, 1]["utt_per_s"], 2)
        ratios[f"identical data.jsonl nj={nj} vs nj=1 {s}"] = \
            by[s, nj]["data_jsonl_sha1"] == by[s, 1]["data_jsonl_sha1"]
    return {"corpus": str(WAV_DIR.relative_to(ROOT)), "cpus": os.cpu_count(), "runs": runs, "ratios": ratios}


def print_table(result: dict) -> None:
    cols = ("set", "utterances", "nj", "seconds", "utt_per_s", "baseline_mib", "self_mib", "child_mib",
            "peak_mib", "tree_mib")
    heads = ("set", "utts", "nj", "seconds", "utt/s", "base MiB", "self MiB", "child MiB", "peak MiB",
             "tree MiB")
    rows = [heads] + [tuple("-" if r[c] is None else str(r[c]) for c in cols) for r in result["runs"]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    print(f"stage 0 on {result['corpus']} ({result['cpus']} CPUs)")
    for row in rows:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
    for name, value in result["ratios"].items():
        print(f"{name}: {value}")


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = program_parser(__doc__)
    parser.add_argument("--nj", type=int, default=2, help="workers of the parallel runs (compared to nj=1)")
    parser.add_argument("--out-json", type=Path, help="also write the runs and ratios here")
    parser.add_argument("--work-dir", type=Path, help="where to build the sets (default: a temporary folder)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.nj, args.result)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_prepare_data.") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = bench(args.nj, work)
    print_table(result)
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
