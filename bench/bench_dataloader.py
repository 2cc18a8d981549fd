"""Benchmark what the trainer is fed: seconds of audio per second, funasr's audio path against stage-1
features, against what one H200 consumes.

Reads speechocean762 from ../shared/data when it is there, else the bundled digit corpus; runs stages
0 and 1 on it into a temporary folder (or --work-dir, reused when its stage 1 is done). Both loaders
are funasr's own ``DataloaderMapStyle`` with the recipe's LengthBucketBatchSampler (what the configs
use), at GPU batch sizes, as the trainer builds them (a new DataLoader every epoch):

  funasr audio path   SenseVoiceCTCDataset: decode the audio (soundfile, as funasr falls back to without
                      torchcodec), WavFrontend fbank + LFR + CMVN, per utterance, every epoch
  stage-1 features    FbankSenseVoiceCTCDataset (data/feats_dataset.py, data/feats_batch.py): each batch
                      read, LFR-stacked, normalised and padded in one pass into a recycled shared
                      buffer (data/shm_pool.py)

Stage-1 features run on the unperturbed utterances repeated so that an epoch holds at least 100
batches (worker start-up and the prefetch it hides then weigh little); funasr's path on the same
utterances once, at the first batch size only (its cost is per utterance), so that the whole bench
takes a few minutes on 2 CPUs. The first batch of each epoch is not timed (worker start-up, reported
apart). The training process takes each batch as a trainer would: to the GPU when there is one (then
with pin_memory, funasr's default), else it reads one float of every 4 KiB page of the features, so
that mapping a worker's shared memory is counted. x realtime per worker = seconds of audio delivered
per second / workers (0 workers: the one process). The CPU figures (from getrusage) say what the work
costs whatever else the machine runs; the wall figures are the target's.

The H200 budget comes from the parameter count of the model that conf/sensevoice_small.yaml trains,
built on the meta device over the released architecture (funasr_recipe/model/released_configs/, the
part of the hub's config.yaml the recipe keeps, as no hub is reachable here): 6 FLOP per parameter per
LFR frame (forward and backward), 100 / lfr_n LFR frames per second of audio, at 40% of 790 bf16
TFLOP/s. Then one row per ablation at 1 worker: what whole batches, recycled buffers and a deeper
prefetch are each worth.

  .venv/bin/python -m bench.bench_dataloader --out-json exp/bench_dataloader.json
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from funasr_recipe.core.cli import program_parser

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "speechocean762"
CONFIG = ROOT / "conf" / "tiny_sensevoice.yaml"  # stage 1's frontend and tokenizer for the bench data
GPU_CONFIG = ROOT / "conf" / "sensevoice_small.yaml"  # the model whose consumption the budget is
H200_BF16_FLOPS, MFU, TARGET = 790e12, 0.40, 15_000
FUNASR, OURS = "SenseVoiceCTCDataset", "FbankSenseVoiceCTCDataset"


def stages01(work: Path, corpus: str) -> tuple[Path, Path]:
    """Stage 0 and stage 1 of the corpus into work/; returns (data dir, dump dir) of the training set."""
    from funasr_recipe.data.validate import validate_set

    data, dump = work / "data", work / "dump"
    done = work / "stages01.json"
    if done.is_file():
        info = json.loads(done.read_text())
        return data / info["train_set"], dump / info["train_set"]
    args = ["--data-dir", str(data)] + (["--corpus-dir", str(SHARED)] if corpus == "speechocean762" else [])
    subprocess.run([sys.executable, "-m", f"recipes.{corpus}.prepare", *args], check=True, cwd=ROOT)
    info = json.loads((data / "corpus.json").read_text())
    for name in info["sets"]:
        validate_set(data / name, language=info["language"])
    common = ["--config", str(CONFIG), "--data-dir", str(data), "--dump-dir", str(dump), "--sets",
              " ".join(info["sets"]), "--train-set", info["train_set"], "--tokenizer-dir", str(dump / "tok"),
              "--", "++build_tokenizer.sp_type=bpe", "++build_tokenizer.vocab_size=500"]
    for mode in ("work", "merge"):  # stage 1 as run.sh runs it
        subprocess.run([sys.executable, "-m", "local.compute_fbank", mode, *common], check=True, cwd=ROOT)
    done.write_text(json.dumps({"train_set": info["train_set"]}))
    return data / info["train_set"], dump / info["train_set"]


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def loader(jsonl: Path, dataset: str, dump: Path, workers: int, batch_size: int, **extra: object):
    """funasr's DataloaderMapStyle over ``jsonl`` with the recipe's sampler, as stage 2 builds it."""
    from funasr.datasets.dataloader_entry import DataloaderMapStyle
    from funasr.frontends.wav_frontend import WavFrontend

    import funasr_recipe.data.batch_sampler  # noqa: F401  (registers LengthBucketBatchSampler)
    import funasr_recipe.data.feats_dataset  # noqa: F401  (registers the Fbank* datasets)
    from funasr_recipe.model.sensevoice_tokenizer import SenseVoiceTagTokenizer

    fe = WavFrontend(cmvn_file=str(dump / "am.mvn"), n_mels=80, frame_length=25, frame_shift=10, lfr_m=7,
                     lfr_n=6, dither=0.0)
    tok = SenseVoiceTagTokenizer(bpemodel=str(dump.parent / "tok" / "chn_jpn_yue_eng_ko_spectok.bpe.model"))
    conf = {"index_ds": "IndexDSJsonl", "batch_sampler": "LengthBucketBatchSampler", "batch_type": "token",
            "batch_size": batch_size, "shuffle": True, "seed": 0, "num_workers": workers,
            "pin_memory": torch.cuda.is_available(), "data_split_num": 1, "max_token_length": 1 << 30,
            **extra}
    return DataloaderMapStyle(frontend=fe, tokenizer=tok, dataset=dataset, train_data_set_list=str(jsonl),
                              valid_data_set_list=str(jsonl), dataset_conf=conf)


def take(batch: dict) -> None:
    """What a trainer does with a batch: to the GPU, or (no GPU) read every page of the features."""
    speech = batch["speech"]
    if torch.cuda.is_available():
        speech.to("cuda", non_blocking=True)
    else:
        float(speech.reshape(-1)[::1024].sum())


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Rate:
    """One loader's measurement over its timed epochs."""

    audio_s: float  # seconds of audio in the timed batches
    wall_s: float
    batches: int
    start_s: float  # mean time to the first batch of an epoch (DataLoader and workers starting)
    main_cpu_s: float  # the training process, timed batches
    worker_cpu_s: float  # all workers, whole epochs (0 workers: the training process)
    epoch_audio_s: float  # seconds of audio in the whole epochs

    def per_worker(self, workers: int) -> float:
        return self.audio_s / self.wall_s / max(workers, 1)

    def per_worker_cpu(self) -> float:
        return self.epoch_audio_s / self.worker_cpu_s


def measure(entry, workers: int, epochs: int) -> Rate:
    """Deliver ``epochs`` epochs of ``entry``'s training loader to this process, as the trainer asks."""
    audio = wall = start = main_cpu = worker_cpu = epoch_audio = 0.0
    batches = 0
    for epoch in range(epochs):
        t0, c0, w0 = time.perf_counter(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
        train, _ = entry.build_iter(epoch=epoch)
        seconds = [sum(train.dataset.get_source_len(i) for i in b) / 100 for b in train.batch_sampler]
        it = iter(train)
        take(next(it))
        t1, c1 = time.perf_counter(), _cpu(resource.RUSAGE_SELF)
        n, batch = 0, None
        for batch in it:
            take(batch)
            n += 1
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t2, c2 = time.perf_counter(), _cpu(resource.RUSAGE_SELF)
        # The DataLoader keeps persistent workers for its next iterator: dropping both joins them, and
        # their CPU time is then in RUSAGE_CHILDREN.
        del it, batch, train
        gc.collect()
        if n != len(seconds) - 1:
            raise RuntimeError(f"the loader delivered {n + 1} batches, its sampler has {len(seconds)}")
        start, audio, wall, batches = start + t1 - t0, audio + sum(seconds[1:]), wall + t2 - t1, batches + n
        main_cpu += c2 - c1
        worker_cpu += (_cpu(resource.RUSAGE_CHILDREN) - w0) if workers else c2 - c0
        epoch_audio += sum(seconds)
    return Rate(audio, wall, batches, start / epochs, main_cpu, worker_cpu, epoch_audio)


def h200_budget() -> tuple[float, float, float]:
    """(seconds of audio per second one H200 consumes, parameters, LFR frames per s of audio) of the model
    conf/sensevoice_small.yaml trains, built on the meta device over the released architecture (read by the
    GPU kit from funasr_recipe/model/released_configs/, the one copy of the released config.yaml)."""
    from bench.gpu.random_model_dir import architecture, build_model, count_parameters

    cfg = architecture("released")
    params = float(count_parameters(build_model(cfg, "meta")))
    lfr_per_s = 100.0 / int(cfg.frontend_conf.get("lfr_n", 1))
    return MFU * H200_BF16_FLOPS / (6 * params * lfr_per_s), params, lfr_per_s


def config_workers() -> dict[int, list[str]]:
    """dataset_conf.num_workers of every conf/*.yaml -> the configs that set it."""
    from omegaconf import OmegaConf

    found: dict[int, list[str]] = {}
    for path in sorted((ROOT / "conf").glob("*.yaml")):
        workers = OmegaConf.load(path).get("dataset_conf", {}).get("num_workers")
        if workers is not None:
            found.setdefault(int(workers), []).append(path.name)
    return found


class BenchPerUtterance:
    """Stage-1 features as they were fed before whole batches: one utterance at a time, then funasr's
    collator (torch fetches item by item when ``__getitems__`` is None). Registered in ``main``."""

    __getitems__ = None


# Ablations at 1 worker: what each change of data/feats_batch.py and data/shm_pool.py is worth.
ABLATIONS = {"per utterance + funasr's collator (before)": ("BenchPerUtterance", {}),
             "whole batch, fresh shared memory": (OURS, {"reuse_batch_memory": False}),
             "whole batch, recycled buffers (default)": (OURS, {}),
             "whole batch, recycled buffers, prefetch_factor 4": (OURS, {"prefetch_factor": 4})}


def row_text(batch_size: int, workers: int, funasr: Rate | None, ours: Rate, note: str = "") -> str:
    """One line of the table: funasr's figure (when measured), ours, their ratio, start-up and CPU."""
    theirs = f"{funasr.per_worker(workers):11,.0f}x" if funasr else f"{'':12s}"
    ratio = f"{ours.per_worker(workers) / funasr.per_worker(workers):5.1f}x" if funasr else f"{'':6s}"
    return (f"{batch_size:6d} {workers:7d} | {theirs} | {ours.per_worker(workers):15,.0f}x {ratio} | "
            f"{ours.start_s:7.2f} {ours.per_worker_cpu():10,.0f}x {1e3 * ours.main_cpu_s / ours.batches:8.2f}"
            f"{note}")


def main() -> None:
    parser = program_parser(__doc__)
    parser.add_argument("--corpus", choices=("speechocean762", "fsdd"),
                        default="speechocean762" if SHARED.is_dir() else "fsdd")
    parser.add_argument("--num-workers", type=int, nargs="+", default=[0, 1, 2],
                        help="DataLoader workers, one row each (the configs' own values are added)")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[20000, 40000],
                        help="padded fbank frames per batch (GPU sizes), one block of rows each; the "
                        "ablation runs at the smallest")
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs of stage-1 features per row "
                        "(an epoch holds at least 100 batches)")
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--out-json", type=Path)
    args = parser.parse_args()
    from funasr.register import tables

    from funasr_recipe.data.feats_dataset import FbankSenseVoiceCTCDataset

    tables.register("dataset_classes", "BenchPerUtterance")(
        type("BenchPerUtterance", (BenchPerUtterance, FbankSenseVoiceCTCDataset), {}))
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_dataloader."))
    began, load = time.perf_counter(), os.getloadavg()[0]
    budget, params, lfr_per_s = h200_budget()
    data_set, dump_set = stages01(work, args.corpus)
    originals = [i for i in lines_of(dump_set / "data.jsonl") if i.get("speed", 1.0) == 1.0]
    frames = sum(i["source_len"] for i in originals)
    repeat = max(1, math.ceil(100 * max(args.batch_size) / frames))
    ours_list = work / f"sp1_x{repeat}.jsonl"  # the same utterances as funasr's path reads, repeated
    ours_list.write_text("".join(json.dumps(i) + "\n" for _ in range(repeat) for i in originals))
    used = config_workers()
    workers = sorted(set(args.num_workers) | set(used))

    def run(name: str, w: int, batch_size: int, **conf: object) -> Rate:
        if name == FUNASR:  # slow: the original utterances once
            return measure(loader(data_set / "data.jsonl", name, dump_set, w, batch_size), w, 1)
        return measure(loader(ours_list, name, dump_set, w, batch_size, **conf), w, args.epochs)

    for name in (FUNASR, OURS):  # warm-up: page cache, lazy imports
        run(name, 0, max(args.batch_size))
    print(f"\ncorpus {args.corpus}: {len(originals)} utterances, {frames / 100:.0f} s of audio (stage-1 "
          f"features: repeated {repeat}x, {args.epochs} epochs); {os.cpu_count()} CPUs, load average "
          f"{load:.1f} at the start; torch threads 1; {'CUDA' if torch.cuda.is_available() else 'no CUDA'}")
    print("x rt/worker = seconds of audio delivered to the training process per second / workers (0: 1)")
    print(f"\n{'':14s} | {'funasr audio':>12s} | {'stage-1 features':>16s} {'':6s} | {'first':>7s} "
          f"{'workers':>11s} {'main CPU':>8s}\n{'batch':>6s} {'workers':>7s} | {'x rt/worker':>12s} | "
          f"{'x rt/worker':>16s} {'ratio':>6s} | {'batch s':>7s} {'x rt/CPU s':>11s} {'ms/batch':>8s}")
    rows, ablations, theirs = [], [], {}
    for batch_size in args.batch_size:
        for w in workers:
            if w not in theirs:  # its cost is per utterance: measured once, at the first batch size
                theirs[w] = (batch_size, run(FUNASR, w, batch_size))
            funasr, ours = theirs[w][1], run(OURS, w, batch_size)
            rows.append({"batch_size": batch_size, "num_workers": w, "funasr_batch_size": theirs[w][0],
                         "funasr": asdict(funasr),
                         "ours": asdict(ours), "funasr_x_rt_per_worker": funasr.per_worker(w),
                         "ours_x_rt_per_worker": ours.per_worker(w),
                         "ours_x_rt_per_worker_cpu_s": ours.per_worker_cpu()})
            print(row_text(batch_size, w, funasr, ours, f"  <- {', '.join(used[w])}" if w in used else ""),
                  flush=True)
    batch_size = min(args.batch_size)  # where a fixed cost per batch weighs most
    print(f"\nablation, 1 worker, batch {batch_size} (stage-1 features):")
    for what, (name, conf) in ABLATIONS.items():
        rate = run(name, 1, batch_size, **conf)
        ablations.append({"batch_size": batch_size, "what": what, **asdict(rate),
                          "x_rt_per_worker": rate.per_worker(1)})
        print(row_text(batch_size, 1, None, rate, f"  {what}"), flush=True)

    print(f"\nfunasr's audio path measured at batch {args.batch_size[0]} only: its cost is per utterance "
          "(decode, resample, fbank)")
    print("configs' dataset_conf.num_workers: "
          + "; ".join(f"{w}: {', '.join(names)}" for w, names in sorted(used.items())))
    print(f"H200 budget: {params / 1e6:.1f} M parameters ({GPU_CONFIG.name} over the released architecture, "
          f"built on the meta device) x 6 FLOP x {lfr_per_s:.1f} LFR frames/s = {6 * params * lfr_per_s:.3g} "
          f"FLOP per s of audio; {MFU:.0%} of {H200_BF16_FLOPS / 1e12:.0f} bf16 TFLOP/s -> {budget:,.0f} "
          "s of audio per s")
    for r in (r for r in rows if r["num_workers"] == 1):
        got = r["ours_x_rt_per_worker"]
        print(f"target at batch {r['batch_size']}: >= {TARGET:,}x realtime per worker; 1 worker delivers "
              f"{got:,.0f}x: {'met' if got >= TARGET else 'MISSED'} ({budget / got:.2f} such workers per "
              "H200)")
    if os.cpu_count() and max(workers) + 1 > os.cpu_count():
        print(f"note: with more than {os.cpu_count() - 1} worker(s) the workers and the training process "
              f"share {os.cpu_count()} CPUs: those rows measure the CPUs, not the loader")
    print("persistent_workers: funasr's trainer builds a new DataLoader every epoch, so workers start once "
          "per epoch whatever it says (first batch s)")
    if not torch.cuda.is_available():
        print("pin_memory: no CUDA here, not measured (the trainer pins only on a GPU)")
    print(f"bench took {time.perf_counter() - began:.0f} s")
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps({"corpus": args.corpus, "repeat": repeat, "epochs": args.epochs,
                                             "load_average": load, "cpus": os.cpu_count(),
                                             "h200_budget_audio_s_per_s": budget, "params": params,
                                             "target": TARGET, "configs_num_workers": used, "rows": rows,
                                             "ablations": ablations}, indent=2))
    if not args.work_dir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
