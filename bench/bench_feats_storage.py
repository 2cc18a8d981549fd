"""Each ``feats_storage`` of stage 1 (funasr_recipe/features/storage.py): bytes per 1,000 h, read speed and
the error of the features read back.

The fbank of the first --max-utterances clips of a stage-0 list is computed with the config's frontend,
as stage 1 computes it, and written once per storage to an ark as stage 1 writes its shards (kaldiio,
keys included), then:
  bytes   the ark's size per second of audio, scaled to 1,000 h (so the clips' length sets the share of
          the per-matrix header and key; the values alone cost 100 frames/s x n_mels x bytes a value);
  read    data/feats_batch.py's ArkReader reads every matrix in ark order, as a training worker reads a
          shard, from the page cache (one untimed pass first), passes repeated for at least --min-seconds
          of CPU: seconds of audio per CPU second of one thread (decoding included);
  error   the largest and the mean absolute difference between what is read back and the exact fbank,
          beside the range of the values; float16 (a cast, not offered: no Kaldi reader knows it) for
          comparison.
The ratios are from this one run, on this machine's page cache: a shared filesystem, where training
reads its shards each epoch, is slower, and its bytes count more.

Reads  --data-jsonl (stage 0's list, e.g. data/train/data.jsonl after ./run.sh --stop-stage 0) and
       --config (its frontend_conf); writes the arks to a temporary folder it removes, and --out-json.

  .venv/bin/python -m bench.bench_feats_storage --data-jsonl data/train/data.jsonl [--max-utterances 2000] \\
      [--out-json exp/bench_feats_storage.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import kaldiio
import numpy as np

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.feats_batch import ArkReader
from funasr_recipe.features.fbank import FbankExtractor
from funasr_recipe.features.storage import BYTES_PER_VALUE, STORAGES, compression
from funasr_recipe.model.config import fbank_conf, load_config

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
HOURS = 1000.0


def features(data_jsonl: Path, config: Path, limit: int) -> tuple[dict[str, np.ndarray], float]:
    """{key: exact fbank} of the list's first ``limit`` clips, and their seconds of audio."""
    conf = fbank_conf(load_config(config))
    extractor = FbankExtractor(conf)
    mats, seconds = {}, 0.0
    for _, item in itertools.islice(iter_jsonl(data_jsonl), limit):
        mats[item["key"]] = extractor.from_file(item["source"])
        seconds += mats[item["key"]].shape[0] * conf.frame_shift / 1000
    if not mats:
        raise BadInputError(f"{data_jsonl}: no utterances")
    return mats, seconds


def write_ark(mats: dict[str, np.ndarray], storage: str, folder: Path) -> dict[str, str]:
    """The ark of ``storage`` (stage 1's writer), as {key: source}."""
    ark, scp = folder / f"{storage}.ark", folder / f"{storage}.scp"
    with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}", compression_method=compression(storage)) as writer:
        for key, mat in mats.items():
            writer(key, mat)
    return dict(line.split(" ", 1) for line in scp.read_text(encoding="utf-8").splitlines())


def read_speed(sources: dict[str, str], mats: dict[str, np.ndarray], min_seconds: float) -> tuple[float, int]:
    """(CPU seconds a pass over every matrix takes, passes made); one untimed pass fills the page cache."""
    reader = ArkReader()
    dims = {k: m.shape for k, m in mats.items()}

    def one_pass() -> None:
        for key, source in sources.items():
            reader.read(source, *dims[key])

    one_pass()
    passes, start = 0, time.process_time()
    while passes == 0 or time.process_time() - start < min_seconds:
        one_pass()
        passes += 1
    return (time.process_time() - start) / passes, passes


def errors(back: dict[str, np.ndarray], mats: dict[str, np.ndarray]) -> dict[str, float]:
    """Largest and mean absolute error of every value read back."""
    worst, total, count = 0.0, 0.0, 0
    for key, mat in mats.items():
        diff = np.abs(back[key].astype(np.float64) - mat)
        worst, total, count = max(worst, float(diff.max())), total + float(diff.sum()), count + diff.size
    return {"max_abs_error": worst, "mean_abs_error": total / count}


def measure(mats: dict[str, np.ndarray], audio_s: float, folder: Path, min_seconds: float) -> list[dict]:
    """One row per storage, then float16's error for comparison."""
    rows = []
    for storage in STORAGES:
        sources = write_ark(mats, storage, folder)
        ark_bytes = (folder / f"{storage}.ark").stat().st_size
        pass_s, passes = read_speed(sources, mats, min_seconds)
        reader = ArkReader()
        back = {k: reader.read(s, *mats[k].shape).copy() for k, s in sources.items()}
        rows.append({"storage": storage, "bytes_per_value": BYTES_PER_VALUE[storage], "ark_bytes": ark_bytes,
                     "gb_per_1000h": ark_bytes / audio_s * HOURS * 3600 / 1e9,
                     "read_audio_s_per_cpu_s": audio_s / pass_s, "read_passes": passes, **errors(back, mats)})
    cast = {k: m.astype(np.float16).astype(np.float32) for k, m in mats.items()}
    rows.append({"storage": "float16 (not offered)", "bytes_per_value": 2, **errors(cast, mats)})
    return rows


def table(rows: list[dict], mats: dict[str, np.ndarray], audio_s: float) -> str:
    """The markdown table of the rows, with what the features were."""
    low = min(float(m.min()) for m in mats.values())
    high = max(float(m.max()) for m in mats.values())
    lines = [f"{len(mats)} utterances, {audio_s / len(mats):.2f} s each on average, values {low:.2f} to "
             f"{high:.2f}", "",
             "| storage | bytes a value | GB per 1,000 h | vs float32 | read: s of audio per CPU s | "
             "max abs error | mean abs error |", "|---|---:|---:|---:|---:|---:|---:|"]
    base = rows[0]
    for r in rows:
        written = "ark_bytes" in r
        size = f"{r['gb_per_1000h']:.1f} | {r['ark_bytes'] / base['ark_bytes']:.3f}" if written else "- | -"
        speed = f"{r['read_audio_s_per_cpu_s']:.0f}" if "read_audio_s_per_cpu_s" in r else "-"
        lines.append(f"| {r['storage']} | {r['bytes_per_value']} | {size} | {speed} | "
                     f"{r['max_abs_error']:.2e} | {r['mean_abs_error']:.2e} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> None:
    mats, audio_s = features(args.data_jsonl, args.config, args.max_utterances)
    log.info("%d utterances, %.0f s of audio: writing and reading each storage", len(mats), audio_s)
    with tempfile.TemporaryDirectory(prefix="bench_feats_storage.") as tmp:
        rows = measure(mats, audio_s, Path(tmp), args.min_seconds)
    text = table(rows, mats, audio_s)
    print(text)
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps({"data_jsonl": str(args.data_jsonl), "utterances": len(mats),
                                             "audio_s": audio_s, "rows": rows}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = program_parser(__doc__)
    parser.add_argument("--data-jsonl", type=Path, default=Path("data/train/data.jsonl"),
                        help="stage 0's list of the clips")
    parser.add_argument("--config", type=Path, default=ROOT / "conf" / "tiny_sensevoice.yaml",
                        help="the model config whose frontend computes the fbank")
    parser.add_argument("--max-utterances", type=int, default=2000)
    parser.add_argument("--min-seconds", type=float, default=2.0, help="CPU seconds of reading per storage")
    parser.add_argument("--out-json", type=Path)
    args = parser.parse_args(argv)
    setup_logging()
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    sys.exit(main())
