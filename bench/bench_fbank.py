"""Benchmark stage 1 feature extraction per process, against funasr's per-utterance path.

Reads speechocean762 (16 kHz, about 3.4 s per utterance) from ../shared/data when it is there, else
the bundled digit corpus (8 kHz, 0.4 s; resampling and per-call overheads dominate there); validates
it with stage 0 into a temporary folder (or --work-dir) and repeats its list --repeat times under new
keys. Every wav is read once before timing, so no method pays for a cold page cache. Each method
runs single-threaded, as a stage-1 process does, on the same utterances:

  funasr path       funasr's loader (load_audio_text_image_video: torchaudio.load, i.e. torchcodec)
                    + WavFrontend (fbank, LFR, CMVN) per utterance: what its dataset does every epoch
  stage 1, 1 proc   ``local.compute_fbank work``'s library call: soundfile read, resample, fbank, CMVN stats,
                    ark/scp/jsonl writes, .done markers: the real program, timed in-process
  stage 1, 2 procs  the same with --world-size 2, two forked processes started together (wall time)
  torchaudio fbank  torchaudio.compliance.kaldi.fbank alone, on waveforms already in memory at 16 kHz
  kaldi-native-fbank  knf.OnlineFbank alone, on the same in-memory waveforms

Speed is seconds of audio per second of wall time ("x realtime"). The ratios printed at the end are
all from this one run.

  .venv/bin/python -m bench.bench_fbank --out-json exp/bench_fbank.json
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from funasr_recipe.core.cli import program_parser

torch.set_num_threads(1)  # a stage-1 process is single-threaded (path.sh sets OMP_NUM_THREADS=1)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "speechocean762"
CONFIG = ROOT / "conf" / "tiny_sensevoice.yaml"


def prepare(work: Path, corpus: str, repeat: int) -> tuple[Path, list[dict]]:
    """Stage 0 of the corpus into work/data; train = every utterance of every set, ``repeat`` times."""
    from funasr_recipe.core.jsonl import iter_jsonl
    from funasr_recipe.data.validate import validate_set

    data = work / "data"
    args = ["--data-dir", str(data)] + (["--corpus-dir", str(SHARED)] if corpus == "speechocean762" else [])
    subprocess.run([sys.executable, "-m", f"recipes.{corpus}.prepare", *args], check=True, cwd=ROOT)
    items = []
    for set_dir in sorted(p for p in data.iterdir() if p.is_dir()):
        validate_set(set_dir)
        items += [obj for _, obj in iter_jsonl(set_dir / "data.jsonl")]
    (data / "bench").mkdir()
    with open(data / "bench" / "data.jsonl", "w") as f:
        for rep in range(repeat):
            for item in items:
                f.write(json.dumps({**item, "key": f"r{rep}-{item['key']}"}) + "\n")
    for item in items:  # warm the page cache
        Path(item["source"]).read_bytes()
    return data, items


def audio_seconds(items: list[dict]) -> float:
    return sum(sf.info(i["source"]).duration for i in items)


def time_funasr(items: list[dict], cmvn: Path) -> float:
    from funasr.frontends.wav_frontend import WavFrontend
    from funasr.utils.load_utils import extract_fbank, load_audio_text_image_video

    fe = WavFrontend(cmvn_file=str(cmvn), n_mels=80, frame_length=25, frame_shift=10, lfr_m=7, lfr_n=6,
                     dither=0.0)
    start = time.perf_counter()
    for item in items:
        wave = load_audio_text_image_video(item["source"], fs=16000)
        extract_fbank(wave, data_type="sound", frontend=fe, is_final=True)
    return time.perf_counter() - start


def load16k(items: list[dict]) -> list[torch.Tensor]:
    from funasr_recipe.features.fbank import resample

    out = []
    for item in items:
        x, rate = sf.read(item["source"], dtype="float32")
        out.append(resample(torch.from_numpy(x)[None], rate, 16000)[0] * 32768)
    return out


def time_torchaudio(waves: list[torch.Tensor]) -> float:
    from torchaudio.compliance import kaldi

    start = time.perf_counter()
    for w in waves:
        kaldi.fbank(w[None], num_mel_bins=80, frame_length=25, frame_shift=10, dither=0.0, energy_floor=0.0,
                    window_type="hamming", sample_frequency=16000)
    return time.perf_counter() - start


def time_knf(waves: list[torch.Tensor]) -> float | None:
    try:
        import kaldi_native_fbank as knf
    except ImportError:
        return None
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0
    opts.frame_opts.window_type = "hamming"
    opts.mel_opts.num_bins = 80
    opts.energy_floor = 0
    lists = [w.tolist() for w in waves]
    start = time.perf_counter()
    for samples in lists:
        fb = knf.OnlineFbank(opts)
        fb.accept_waveform(16000, samples)
        fb.input_finished()
        np.stack([fb.get_frame(i) for i in range(fb.num_frames_ready)])
    return time.perf_counter() - start


def _stage1(dump: Path, data: Path, rank: int, world: int) -> None:
    """Stage 1's work (local/compute_fbank.py work) of one rank, in this process."""
    from funasr_recipe.features.dump import compute_shards, plan_sets
    from funasr_recipe.model.config import fbank_conf, load_config

    conf = fbank_conf(load_config(CONFIG))
    plans = plan_sets(data, dump, ["bench"], "none", "1.0", 100, conf)
    compute_shards(plans, conf, rank, world, strict=False)


def time_stage1(work: Path, data: Path, world: int, tag: str) -> float:
    """Wall time of ``world`` forked stage-1 processes over the whole list (fresh dump dir)."""
    import funasr_recipe.features.dump  # noqa: F401  (imported before forking: the children start warm)

    dump = work / f"dump_{tag}"
    shutil.rmtree(dump, ignore_errors=True)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_stage1, args=(dump, data, r, world)) for r in range(world)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - start
    if any(p.exitcode for p in procs):
        raise SystemExit(f"stage 1 with {world} processes failed")
    return elapsed


def main() -> None:
    parser = program_parser(__doc__)
    parser.add_argument("--corpus", choices=("speechocean762", "fsdd"),
                        default="speechocean762" if SHARED.is_dir() else "fsdd")
    parser.add_argument("--repeat", type=int, default=3, help="copies of the list for stage 1's runs")
    parser.add_argument("--sample", type=int, default=400, help="utterances timed for the per-call methods")
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--out-json", type=Path)
    args = parser.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_fbank."))
    data, items = prepare(work, args.corpus, args.repeat)
    sample = items[: args.sample]
    total_s, sample_s = audio_seconds(items) * args.repeat, audio_seconds(sample)

    _stage1(work / "dump_warmup", data, 0, 50)  # the first shard of a tiny slice: caches, imports
    x1 = time_stage1(work, data, 1, "x1")
    x2 = time_stage1(work, data, 2, "x2")
    stats = next((work / "dump_x1" / "bench" / "shards").glob("*.stats.npz"))
    from funasr_recipe.features.cmvn import CmvnStats, write_am_mvn

    cmvn = work / "am.mvn"
    write_am_mvn(cmvn, *CmvnStats.load(stats).mean_std())
    waves = load16k(sample)
    rows = {
        "funasr path (loader + WavFrontend)": sample_s / time_funasr(sample, cmvn),
        "stage 1, 1 process (read + write incl.)": total_s / x1,
        "stage 1, 2 processes, per process": total_s / x2 / 2,
        "torchaudio kaldi.fbank alone (in memory)": sample_s / time_torchaudio(waves),
    }
    knf_s = time_knf(waves)
    if knf_s:
        rows["kaldi-native-fbank alone (in memory)"] = sample_s / knf_s
    ours = rows["stage 1, 1 process (read + write incl.)"]
    funasr = rows["funasr path (loader + WavFrontend)"]
    bare = rows["torchaudio kaldi.fbank alone (in memory)"]
    ratios = {
        "stage 1 / funasr path": (ours / funasr, 4.0),
        "stage 1 / bare torchaudio fbank": (ours / bare, 0.75),
        "stage 1 2 processes / 1 process (wall)": (x1 / x2, 1.8),
    }
    print(f"\ncorpus {args.corpus}: {len(items)} utterances, {audio_seconds(items) / len(items):.2f} s each; "
          f"stage 1 over {args.repeat}x = {total_s / 3600:.2f} h; per-call methods over {len(sample)}; "
          f"{os.cpu_count()} cores")
    print(f"{'method':44s} {'x realtime':>11s}")
    for name, speed in rows.items():
        print(f"{name:44s} {speed:11.0f}")
    print(f"\n{'ratio':44s} {'measured':>9s} {'target':>8s}")
    for name, (value, target) in ratios.items():
        print(f"{name:44s} {value:9.2f} {'>= ' + str(target):>8s}  {'ok' if value >= target else 'MISSED'}")
    print(f"{'stage 1 absolute (x realtime per process)':44s} {ours:9.0f} {'>= 2000':>8s}  "
          f"{'ok' if ours >= 2000 else 'MISSED'}")
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps({"corpus": args.corpus, "x_realtime": rows,
                                             "ratios": {k: v[0] for k, v in ratios.items()}}, indent=2))
    if not args.work_dir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
