"""Benchmark what the trainer is fed: utterances/s from stage-1 features against funasr's audio path.

Reads speechocean762 from ../shared/data when it is there, else the bundled digit corpus; runs stages
0 and 1 on it into a temporary folder (or --work-dir). Then both loaders are funasr's own
``DataloaderMapStyle`` with the same index, batch sampler, batch size and --num-workers, over the same
utterances (the unperturbed training copies), as the trainer builds them:

  funasr audio path   dataset SenseVoiceCTCDataset: decode the audio (funasr's loader), resample,
                      WavFrontend fbank + LFR + CMVN, per utterance, every epoch
  stage-1 features    dataset FbankSenseVoiceCTCDataset (funasr_recipe/data/feats_dataset.py): read the fbank,
                      LFR + CMVN

Each loader runs --epochs epochs after one warm-up epoch (worker start-up excluded), once per
--num-workers value; the ratios are measured in this one run. torch uses one thread per process, as
path.sh sets for the ranks. Without torchcodec installed (our requirements do not pull it in),
funasr's loader falls back to soundfile after torchaudio.load raises; with torchcodec it decodes
through FFmpeg, which the issue measured as about 30x slower for WAV.

  python -m bench.bench_dataloader --out-json exp/bench_dataloader.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "speechocean762"
CONFIG = ROOT / "conf" / "tiny_sensevoice.yaml"


def stages01(work: Path, corpus: str) -> tuple[Path, Path]:
    """Stage 0 and stage 1 of the corpus into work/; returns (data dir, dump dir)."""
    from funasr_recipe.data.validate import validate_set

    data, dump = work / "data", work / "dump"
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
    return data / info["train_set"], dump / info["train_set"]


def loader(jsonl: Path, dataset: str, dump: Path, workers: int, batch_size: int):
    from funasr.datasets.dataloader_entry import DataloaderMapStyle
    from funasr.frontends.wav_frontend import WavFrontend

    import funasr_recipe.data.feats_dataset  # noqa: F401  (registers the Fbank* datasets)
    from funasr_recipe.model.sensevoice_tokenizer import SenseVoiceTagTokenizer

    fe = WavFrontend(cmvn_file=str(dump / "am.mvn"), n_mels=80, frame_length=25, frame_shift=10, lfr_m=7,
                     lfr_n=6, dither=0.0)
    tok = SenseVoiceTagTokenizer(bpemodel=str(dump.parent / "tok" / "chn_jpn_yue_eng_ko_spectok.bpe.model"))
    conf = {"index_ds": "IndexDSJsonl", "batch_sampler": "BatchSampler", "batch_type": "token",
            "batch_size": batch_size, "shuffle": True, "num_workers": workers, "data_split_num": 1}
    return DataloaderMapStyle(frontend=fe, tokenizer=tok, dataset=dataset, train_data_set_list=str(jsonl),
                              valid_data_set_list=str(jsonl), dataset_conf=conf)


def utts_per_second(entry, epochs: int) -> tuple[float, int]:
    """Utterances per second over ``epochs`` epochs, after a warm-up epoch."""
    count, seconds = 0, 0.0
    for epoch in range(epochs + 1):
        train, _ = entry.build_iter(epoch=epoch)
        it = iter(train)
        first = next(it)  # worker start-up is not the loader's steady state
        start, n = time.perf_counter(), 0
        for batch in it:
            n += batch["speech"].shape[0]
        if epoch:
            count, seconds = count + n, seconds + time.perf_counter() - start
        del first
    return count / seconds, count


def _has_torchcodec() -> bool:
    try:
        import torchcodec  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=("speechocean762", "fsdd"),
                        default="speechocean762" if SHARED.is_dir() else "fsdd")
    parser.add_argument("--num-workers", type=int, nargs="+", default=[0, 1, 2],
                        help="DataLoader workers (the same for both loaders), one row each")
    parser.add_argument("--batch-size", type=int, default=6000, help="padded fbank frames per batch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--out-json", type=Path)
    args = parser.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_dataloader."))
    data_set, dump_set = stages01(work, args.corpus)
    originals = work / "sp1.jsonl"  # the same utterances for both: stage 1's unperturbed copies
    originals.write_text("".join(line + "\n" for line in (dump_set / "data.jsonl").read_text().split("\n")
                                 if line and json.loads(line)["speed"] == 1.0))
    paths = {"SenseVoiceCTCDataset": data_set / "data.jsonl", "FbankSenseVoiceCTCDataset": originals}
    print(f"\ncorpus {args.corpus}: utterances/s delivered by funasr's DataloaderMapStyle, batch_size "
          f"{args.batch_size} frames, {args.epochs} epoch(s) after a warm-up")
    print(f"{'DataLoader workers':>18s} {'funasr audio path':>18s} {'stage-1 features':>17s} {'ratio':>7s}")
    results = []
    for workers in args.num_workers:
        rates = [utts_per_second(loader(paths[d], d, dump_set, workers, args.batch_size), args.epochs)[0]
                 for d in paths]
        results.append({"num_workers": workers, "funasr_utt_per_s": rates[0], "fbank_utt_per_s": rates[1],
                        "ratio": rates[1] / rates[0]})
        print(f"{workers:18d} {rates[0]:18.1f} {rates[1]:17.1f} {rates[1] / rates[0]:6.1f}x")
    best = max(r["ratio"] for r in results)
    print(f"\nbest ratio {best:.1f}x (target >= 10: {'ok' if best >= 10 else 'MISSED'}); "
          f"torchcodec {'is' if _has_torchcodec() else 'is NOT'} installed, so funasr's loader "
          + ("decodes through torchaudio.load" if _has_torchcodec()
             else "falls back to soundfile after torchaudio.load raises"))
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps({"corpus": args.corpus, "rows": results}, indent=2))
    if not args.work_dir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
