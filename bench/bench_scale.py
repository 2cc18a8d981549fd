"""How the recipe's per-utterance steps grow with the corpus: time and peak memory of stage 0, the stage-1
merge (with the line index), the training start-up of one rank (index, then sampler) and scoring, at a
few corpus sizes; the per-utterance and fixed cost of each fitted over the sizes, and the projection for
10 M utterances (10,000 hours of 3.6 s utterances).

For each N of --utterances, in <work-dir>/<N>/:
  corpus   a Kaldi dir of N utterances that reuse the bundled digit recordings (corpora/) in turn;
  stage 0  ``python -m local.prepare_data --set-dir`` on it (validation, audio headers, data.jsonl);
  stage 1  its shards written directly (fbank of each distinct recording, computed once; every shard's
           ark a hard link of those matrices, its scp/jsonl/stats/marker as stage 1 writes them: the
           merge checks and concatenates them as it would real ones), then ``python -m
           local.compute_fbank merge`` with conf/tiny_sensevoice.yaml: shard checks, concatenation,
           CMVN, tokenizer, target checks, raw.jsonl and the line indexes;
  start-up one fresh process per index (funasr's IndexDSJsonl, then the recipe's IndexDSJsonlMmap) that
           builds the training dataset as stage 2 does (FbankAudioDataset over the index), then the
           recipe's LengthBucketBatchSampler and one epoch of funasr's BatchSampler over it, and the
           skipped-utterance check (train/skipped.py) that every rank runs first;
  scoring  ``python -m local.score`` on N hypotheses (about a word in ten substituted).
Wall time; peak memory is the peak RSS of the step's process (getrusage), and for the start-up the RSS
growth of the process over the step ("resident"), which counts the mapped index pages it touched (shared
by every process of a node) as well as its private memory ("private": smaps' Private_*). Each start-up
measurement prints

  index: N utterances, X bytes resident per utterance per process, load Y s

Reads  corpora/free-spoken-digit-dataset; writes <work-dir>/<N>/ (removed unless --keep; several GB at
10^6) and --out-json.

  .venv/bin/python -m bench.bench_scale --utterances 10000 100000 1000000 --out-json exp/bench_scale.json
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from funasr_recipe.core.cli import program_parser
from funasr_recipe.core.log import setup_logging

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = ROOT / "corpora" / "free-spoken-digit-dataset" / "recordings"
CONFIG = ROOT / "conf" / "tiny_sensevoice.yaml"
DIGITS = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()
SHARD_SIZE = 10_000  # jobs per shard: 100 shards at 10^6
PROJECT = 10_000_000
INDEXES = ("IndexDSJsonl", "IndexDSJsonlMmap")
_BASE: dict[str, tuple] = {}  # recording -> (its fbank, its CMVN stats)


# Runs a program module and writes its peak RSS (VmHWM, KiB) to a file at exit. getrusage's ru_maxrss of
# a child would not do: it starts from the RSS of the process that spawned it (this one, with torch).
PEAK = ("import atexit, runpy, sys\n"
        "out, module = sys.argv.pop(1), sys.argv.pop(1)\n"
        "def peak():\n"
        "    status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "    open(out, 'w').write(status['VmHWM'].split()[0])\n"
        "atexit.register(peak)\n"
        "runpy.run_module(module, run_name='__main__', alter_sys=True)\n")


def peak_mib() -> float:
    """This process's peak RSS since its exec."""
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(status["VmHWM"].split()[0]) / 1024


def run_timed(module: str, args: list[str], log_file: Path) -> tuple[float, float]:
    """(wall s, peak RSS MiB) of ``python -m module args``; RuntimeError naming its log when it fails."""
    peak = log_file.with_suffix(".peak")
    start = time.perf_counter()
    with open(log_file, "w", encoding="utf-8") as out:
        rc = subprocess.run([sys.executable, "-c", PEAK, str(peak), module, *args], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"python -m {module} {' '.join(args)} failed; see {log_file}")
    return time.perf_counter() - start, int(peak.read_text()) / 1024


def write_corpus(set_dir: Path, n: int) -> None:
    """A Kaldi dir of n utterances cycling over the bundled recordings, keys prefixed by speaker."""
    wavs = sorted(RECORDINGS.glob("*.wav"))
    set_dir.mkdir(parents=True, exist_ok=True)
    with open(set_dir / "wav.scp", "w") as scp, open(set_dir / "text", "w") as text, \
            open(set_dir / "utt2spk", "w") as spk:
        for i in range(n):
            wav = wavs[i % len(wavs)]
            digit, speaker, _ = wav.stem.split("_")
            key = f"{speaker}-{i:08d}"
            scp.write(f"{key} {wav}\n")
            text.write(f"{key} {DIGITS[int(digit)]}\n")
            spk.write(f"{key} {speaker}\n")


def write_shards(data_dir: Path, dump_dir: Path) -> None:
    """Stage 1's shards of data_dir/train as ``compute_shards`` lays them out, without computing a
    matrix per utterance: one matrix per distinct recording, in one ark that every shard hard-links."""
    import kaldiio

    from funasr_recipe.dist.markers import mark_done
    from funasr_recipe.features.audio import load_audio
    from funasr_recipe.features.cmvn import CmvnStats
    from funasr_recipe.features.dump import plan_sets
    from funasr_recipe.features.fbank import FbankExtractor
    from funasr_recipe.features.shard_sums import RECORD, record
    from funasr_recipe.model.config import fbank_conf, load_config

    conf = fbank_conf(load_config(CONFIG, []))
    (plan,) = plan_sets(data_dir, dump_dir, ["train"], "train", "1.0", SHARD_SIZE, conf)
    (plan.out / "shards").mkdir(parents=True, exist_ok=True)
    if not _BASE:  # computed once per run of the bench, for every size
        extractor = FbankExtractor(conf)
        for wav in sorted(RECORDINGS.glob("*.wav")):
            mat = extractor.from_wave(*load_audio(str(wav)), 1.0)
            _BASE[str(wav)] = (mat, CmvnStats())
            _BASE[str(wav)][1].add_lfr(mat, conf.lfr_m, conf.lfr_n)
    mats, stats = {k: m for k, (m, _) in _BASE.items()}, {k: st for k, (_, st) in _BASE.items()}
    base = plan.out / "shards" / "base.ark"
    with kaldiio.WriteHelper(f"ark,scp:{base},{base.with_suffix('.scp')}") as w:
        for wav, mat in mats.items():
            w(Path(wav).stem, mat)
    offsets = dict(line.split() for line in base.with_suffix(".scp").read_text().splitlines())
    with open(plan.jsonl, encoding="utf-8") as src:
        for shard in range(plan.n_shards):
            ark = plan.shard_path(shard, "ark").resolve()
            os.link(base, ark)
            seen: dict[str, int] = {}
            with open(plan.shard_path(shard, "jsonl"), "w") as js, \
                    open(plan.shard_path(shard, "scp"), "w") as sc:
                for _ in range(min(plan.shard_size, plan.n_jobs - shard * plan.shard_size)):
                    obj = json.loads(src.readline())
                    wav = obj.pop("source")
                    for k in ("sample_rate", "channels"):
                        obj.pop(k, None)
                    source = f"{ark}:{offsets[Path(wav).stem].rsplit(':', 1)[1]}"
                    seen[wav] = seen.get(wav, 0) + 1
                    sc.write(f"{obj['key']} {source}\n")
                    js.write(json.dumps({**obj, "speed": 1.0, "source": source,
                                         "source_len": len(mats[wav]), "wav": wav, "feat_dim": conf.n_mels},
                                        ensure_ascii=False) + "\n")
            total = CmvnStats()
            for wav, k in seen.items():  # each recording's frames, as often as the shard holds it
                one = stats[wav]
                total._accumulate(one.count * k, one.sum * k, one.sumsq * k)
            total.save(plan.shard_path(shard, "stats.npz"))
            plan.shard_path(shard, "rejected.tsv").write_text("")
            summary = {"accepted": sum(seen.values()), "rejected": {}, "frames": 0, "audio_s": 0.0,
                       "compute_s": 0.0, RECORD: record(plan.shard_path(shard, "done"))}
            mark_done(plan.shard_path(shard, "done"), plan.fingerprint, summary)


def smaps() -> tuple[int, int]:
    """(RSS, private bytes) of this process."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup") if ":" in line)
    kib = {k: int(v.split()[0]) for k, v in fields.items() if v.strip().endswith("kB")}
    return kib["Rss"] * 1024, (kib["Private_Clean"] + kib["Private_Dirty"]) * 1024


def probe_startup(jsonl: Path, index: str) -> dict:
    """One rank's start-up over ``index`` (module docstring), in this process."""
    import gc

    from funasr.register import tables

    import funasr_recipe.data.index_ds  # noqa: F401  (registers IndexDSJsonlMmap)
    from funasr_recipe.data.batch_sampler import BucketBatchSampler
    from funasr_recipe.data.feats_dataset import FbankAudioDataset
    from funasr_recipe.train import skipped

    conf = {"index_ds": index, "batch_type": "token", "batch_size": 6000, "max_token_length": 2000}
    out = {}
    gc.collect()
    rss0, priv0 = smaps()
    t0 = time.perf_counter()
    dataset = FbankAudioDataset(str(jsonl), frontend=None, tokenizer=None, **conf)
    if index == "IndexDSJsonlMmap":
        dataset.source_lengths().sum()  # the pages the samplers read: counted, as they will be touched
    out["index_s"] = time.perf_counter() - t0
    gc.collect()
    rss1, priv1 = smaps()
    n = len(dataset)
    out |= {"n": n, "index_resident_b": (rss1 - rss0) / n, "index_private_b": (priv1 - priv0) / n}
    print(f"index: {n} utterances, {out['index_resident_b']:.0f} bytes resident per utterance per process, "
          f"load {out['index_s']:.2f} s  ({index}; {out['index_private_b']:.0f} bytes private)", flush=True)
    t0 = time.perf_counter()
    sampler = BucketBatchSampler(dataset, batch_size=conf["batch_size"], batch_type="token", rank=0,
                                 world_size=8, max_token_length=conf["max_token_length"])
    sampler.set_epoch(0)
    len(sampler)
    out["sampler_s"] = time.perf_counter() - t0
    gc.collect()
    rss2, _ = smaps()
    out["sampler_resident_b"] = (rss2 - rss1) / n
    del sampler
    t0 = time.perf_counter()
    funasr = tables.batch_sampler_classes.get("BatchSampler")(dataset, **conf)["batch_sampler"]
    funasr.set_epoch(0)
    out["funasr_sampler_batches"] = sum(1 for _ in funasr)
    out["funasr_sampler_epoch_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    skipped.find_skips({"dataset_conf": conf, "train_data_set_list": str(jsonl),
                        "valid_data_set_list": str(jsonl)})
    out["skipped_check_s"] = time.perf_counter() - t0
    out["peak_mib"] = peak_mib()
    return out


def write_decode(decode: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    decode.mkdir(parents=True, exist_ok=True)
    with open(decode / "ref.txt", "w") as ref, open(decode / "hyp.txt", "w") as hyp:
        for i in range(n):
            words = [DIGITS[d] for d in rng.integers(0, 10, int(rng.integers(1, 8)))]
            ref.write(f"utt{i:08d} {' '.join(words)}\n")
            said = [DIGITS[rng.integers(0, 10)] if rng.random() < 0.1 else w for w in words]
            hyp.write(f"utt{i:08d} {' '.join(said)}\n")


def measure(n: int, work: Path) -> dict:
    """Every step at n utterances (module docstring); one row each."""
    py = sys.executable
    data, dump = work / "data", work / "dump"
    write_corpus(data / "train", n)
    rows = {}
    rows["stage 0"] = run_timed("local.prepare_data", ["--set-dir", str(data / "train"), "--language", "en"],
                                work / "stage0.log")
    write_shards(data, dump)
    common = ["--config", str(CONFIG), "--data-dir", str(data), "--dump-dir", str(dump), "--sets", "train",
              "--train-set", "train", "--shard-size", str(SHARD_SIZE)]
    rows["stage 1 merge + index"] = run_timed("local.compute_fbank", ["merge", *common, "--tokenizer-dir",
                                                                      str(dump / "tok")], work / "merge.log")
    indexed = re.findall(r"data\.jsonl: \d+ lines indexed in ([\d.]+) s", (work / "merge.log").read_text())
    startup = {}
    for index in INDEXES:
        res = subprocess.run([py, "-m", "bench.bench_scale", "--probe", index, "--jsonl",
                              str(dump / "train" / "data.jsonl")], cwd=ROOT, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"start-up probe over {index} failed:\n{res.stderr[-3000:]}")
        print(next(line for line in res.stdout.splitlines() if line.startswith("index: ")), flush=True)
        startup[index] = json.loads(res.stdout.splitlines()[-1])
    write_decode(work / "decode_dev", n)
    rows["scoring"] = run_timed("local.score", ["--dir", str(work / "decode_dev")], work / "score.log")
    return {"n": n, "steps": {k: {"wall_s": w, "peak_mib": m} for k, (w, m) in rows.items()},
            "index_build_s": float(indexed[0]) if indexed else None, "startup": startup}


def fit(ns: list[int], values: list[float]) -> tuple[float, float]:
    """(fixed, per utterance) of a least-squares line through (n, value)."""
    if len(ns) < 2:
        return 0.0, values[0] / ns[0]
    per, fixed = np.polyfit(np.asarray(ns, float), np.asarray(values, float), 1)
    return float(fixed), float(per)


def report(results: list[dict]) -> str:
    """The tables: each step at each size, the fit and the 10 M projection."""
    ns = [r["n"] for r in results]
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in results:
        for step, v in r["steps"].items():
            series.setdefault(step, ([], []))
            series[step][0].append(v["wall_s"])
            series[step][1].append(v["peak_mib"])
        for index, s in r["startup"].items():
            for part, t, b in (("index", s["index_s"], s["index_resident_b"] * s["n"] / 2**20),
                               ("sampler", s["sampler_s"], s["sampler_resident_b"] * s["n"] / 2**20)):
                series.setdefault(f"start-up {part}, {index}", ([], []))
                series[f"start-up {part}, {index}"][0].append(t)
                series[f"start-up {part}, {index}"][1].append(b)
            for part in ("funasr_sampler_epoch_s", "skipped_check_s"):
                key = f"start-up {part.removesuffix('_s').replace('_', ' ')}, {index}"
                series.setdefault(key, ([], []))[0].append(s[part])
    head = " | ".join(f"N={n:,}" for n in ns)
    lines = [f"| step | {head} | per utterance | fixed | at 10 M |", "|---" * (len(ns) + 4) + "|"]
    for step, (walls, mems) in series.items():
        mem = "resident MiB" if step.startswith("start-up") else "peak MiB"
        for what, vals, unit, scale in (("s", walls, "us", 1e6), (mem, mems, "B", 2**20)):
            if not vals:
                continue
            fixed, per = fit(ns, vals)
            cells = " | ".join(f"{v:.2f}" for v in vals)
            lines.append(f"| {step} ({what}) | {cells} | {per * scale:.1f} {unit} | {fixed:.1f} | "
                         f"{fixed + per * PROJECT:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = program_parser(__doc__)
    parser.add_argument("--utterances", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--work-dir", type=Path, default=Path("exp/bench_scale"))
    parser.add_argument("--out-json", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep each size's corpus, dump and decode dir")
    parser.add_argument("--probe", choices=INDEXES, help="internal: one start-up measurement, over --jsonl")
    parser.add_argument("--jsonl", type=Path, help="internal: the training list of --probe")
    args = parser.parse_args(argv)
    if args.probe:  # the child process of one start-up measurement
        print(json.dumps(probe_startup(args.jsonl, args.probe)))
        return 0
    setup_logging()
    results = []
    for n in args.utterances:
        work = (args.work_dir / str(n)).resolve()
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        log.info("N = %d in %s", n, work)
        results.append(measure(n, work))
        if not args.keep:
            shutil.rmtree(work)
    text = report(results)
    print(text)
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps({"results": results, "table": text}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
