"""Decode a test set with a model dir, split over every process of every node; node 0 merges.

Reads  <model-dir> in the hub's layout (config.yaml, model.pt, am.mvn, tokenizer: stage 3's
       exp/<tag>/final/ or a pretrained model) and <data-jsonl>, stage 0's index of the set (key,
       source, target, and for SenseVoice text_language, emo_target, event_target);
writes (work)  <out>/shards/<rank>.jsonl, one line per utterance of this rank (raw model output,
               tags, text without tags, or the audio error), and <out>/shards/<rank>.done;
       (merge) <out>/{ref.txt, hyp.txt, ref_tags.tsv, hyp_tags.tsv (SenseVoice), failed.tsv,
               decode.json}: what local/score.py reads.

Utterances are sorted by length and dealt round robin, so every rank gets the same mix; each rank
decodes its share in batches through funasr's AutoModel (its frontend, its model's own inference:
greedy CTC for SenseVoice and Conformer-CTC, Paraformer's predictor), on raw audio as a deployed
model sees it. An unreadable file is reported with file, line and key and left out of hyp.txt, so
the scorer counts it as deletions and lists it.

  python -m local.decode work --model-dir exp/x/final --data-jsonl data/dev/data.jsonl \\
      --out exp/x/decode_dev --rank 0 --world-size 2
  python -m local.decode merge --data-jsonl data/dev/data.jsonl --out exp/x/decode_dev --world-size 2 \\
      --model-name avg5
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

from local.audio import AudioError, load_audio
from local.bad_input import REJECTED_HEADER, Rejection
from local.dist_slice import files_fingerprint, marker_matches, wait_for_shards
from local.log_utils import Progress, setup_logging
from local.sensevoice_tags import EMOTIONS, EVENTS, ITN, LANGUAGES

log = logging.getLogger(__name__)
_TAG = re.compile(r"<\|([^|]*)\|>")
_KINDS = {"language": LANGUAGES, "emotion": EMOTIONS, "event": EVENTS, "itn": ITN}
TAG_COLUMNS = ("language", "emotion", "event")


def split_tags(text: str) -> tuple[dict[str, str], str]:
    """SenseVoice output ``<|en|><|NEUTRAL|><|Speech|><|woitn|>seven`` -> ({kind: name}, "seven").

    Every ``<|...|>`` anywhere in the text is removed from the transcript; the known ones are filed by
    kind (the first of each kind wins), the unknown ones under "other".
    """
    tags: dict[str, str] = {}
    for name in _TAG.findall(text):
        kind = next((k for k, names in _KINDS.items() if name in names), "other")
        tags.setdefault(kind, name)
    return tags, " ".join(_TAG.sub(" ", text).split())


def bare_tag(value: str | None) -> str:
    """``<|en|>`` -> ``en``; None -> ``""``."""
    return "" if not value else value.strip().removeprefix("<|").removesuffix("|>")


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) for every line of a stage-0 JSONL."""
    with open(path, encoding="utf-8") as f:
        return [(n, json.loads(line)) for n, line in enumerate(f, 1) if line.strip()]


def deal(items: list[tuple[int, dict]], rank: int, world_size: int) -> list[tuple[int, dict]]:
    """This rank's utterances: longest first, dealt round robin so that ranks get equal work."""
    ordered = sorted(items, key=lambda it: (-int(it[1].get("source_len", 0)), it[1]["key"]))
    return ordered[rank::world_size]


def batches(items: list[tuple[int, dict]], max_utts: int, max_frames: int) -> list[list[tuple[int, dict]]]:
    """Consecutive batches of at most ``max_utts`` utterances and ``max_frames`` padded 10 ms frames."""
    out: list[list[tuple[int, dict]]] = []
    longest = 0
    for it in items:
        n = int(it[1].get("source_len", 0))
        if out and len(out[-1]) < max_utts and max(longest, n) * (len(out[-1]) + 1) <= max_frames:
            out[-1].append(it)
            longest = max(longest, n)
        else:
            out.append([it])
            longest = n
    return out


def load_model(model_dir: Path, device: str) -> Any:
    """funasr's AutoModel on a local model dir (no hub), with the recipe's model classes registered."""
    from funasr import AutoModel

    import local.models  # noqa: F401  (registers ConformerCTC)

    # ncpu: AutoModel otherwise sets 4 torch threads, whatever the launcher chose (see local/train.py).
    model = AutoModel(model=str(model_dir), device=device, disable_update=True, disable_pbar=True,
                      disable_log=True, ncpu=torch.get_num_threads())
    frontend = model.kwargs.get("frontend")
    if getattr(frontend, "dither", 0.0):
        # A model dir without dither: 0.0 (a hub model's) would add random noise to every input: scores
        # would change from run to run, and stage 1's features, which training saw, have none.
        log.info("decoding with the frontend's dither %s set to 0", frontend.dither)
        frontend.dither = 0.0
    return model


def wave_for(model: Any, source: str) -> torch.Tensor:
    """Mono float audio at the model frontend's rate; raises AudioError."""
    from local.fbank import resample

    data, rate = load_audio(source)
    wave = torch.from_numpy(data.mean(axis=1))
    fs = int(getattr(model.kwargs.get("frontend"), "fs", 16000))
    return resample(wave[None], rate, fs)[0]


def work(args: argparse.Namespace) -> None:
    out = args.out / "shards"
    out.mkdir(parents=True, exist_ok=True)
    done = out / f"{args.rank}.done"
    # What a finished shard was made from: the weights, the set and the split.
    fp = files_fingerprint([args.model_dir / "model.pt", args.model_dir / "config.yaml", args.data_jsonl],
                           args.world_size)
    if marker_matches(done, fp):
        log.info("%s: rank %d is done; skipping", args.out, args.rank)
        return
    mine = deal(read_jsonl(args.data_jsonl), args.rank, args.world_size)
    model = load_model(args.model_dir, args.device)
    emits_tags = type(model.model).__name__ == "SenseVoiceSmall"
    progress = Progress(f"decode {args.data_jsonl.parent.name} rank {args.rank}", len(mine), logger=log)
    audio_s = decode_s = 0.0
    with open(out / f"{args.rank}.jsonl", "w", encoding="utf-8") as f:
        for batch in batches(mine, args.batch_size, args.batch_frames):
            waves, keys = [], []
            for lineno, obj in batch:
                try:
                    waves.append(wave_for(model, obj["source"]))
                    keys.append(obj["key"])
                except AudioError as e:
                    rejection = Rejection(str(args.data_jsonl), lineno, obj["key"], e.reason, e.detail)
                    log.error("%s", rejection.message())
                    f.write(json.dumps({"key": obj["key"], "line": lineno, "error": e.reason,
                                        "detail": e.detail}, ensure_ascii=False) + "\n")
            if waves:
                start = time.perf_counter()
                results = model.generate(input=waves, key=keys, batch_size=len(waves), language="auto",
                                         use_itn=False, disable_pbar=True)
                decode_s += time.perf_counter() - start
                fs = int(getattr(model.kwargs.get("frontend"), "fs", 16000))
                for key, wave, res in zip(keys, waves, results, strict=True):
                    tags, text = split_tags(res.get("text", ""))
                    if emits_tags:  # a tag SenseVoice did not emit is "none": scored as wrong, not skipped
                        tags = {kind: tags.get(kind, "none") for kind in _KINDS} | tags
                    audio_s += len(wave) / fs
                    f.write(json.dumps({"key": key, "raw": res.get("text", ""), "text": text, **tags,
                                        "seconds": len(wave) / fs}, ensure_ascii=False) + "\n")
            progress.update(len(batch))
    progress.close()
    (out / f"{args.rank}.stats.json").write_text(json.dumps(
        {"audio_seconds": audio_s, "decode_seconds": decode_s, "device": args.device}))
    done.write_text(fp + "\n")
    log.info("rank %d: %d utterances, %.1f s of audio in %.1f s (RTF %.4f)", args.rank, len(mine), audio_s,
             decode_s, decode_s / max(audio_s, 1e-9))


def merge(args: argparse.Namespace) -> None:
    shards = args.out / "shards"
    wait_for_shards(lambda r: (shards / f"{r}.done").is_file(), args.world_size, args.world_size,
                    f"decode {args.out}", args.wait_timeout)
    refs = read_jsonl(args.data_jsonl)
    hyps: dict[str, dict] = {}
    for rank in range(args.world_size):
        for _, obj in read_jsonl(shards / f"{rank}.jsonl"):
            hyps[obj["key"]] = obj
    stats = [json.loads((shards / f"{r}.stats.json").read_text()) for r in range(args.world_size)]
    refs.sort(key=lambda it: it[1]["key"])
    failed = [hyps[o["key"]] for _, o in refs if "error" in hyps.get(o["key"], {})]
    lost = [o["key"] for _, o in refs if o["key"] not in hyps]
    if lost:  # a shard that misses utterances is a bug or a changed data.jsonl, not a bad file
        raise RuntimeError(f"{args.out}: {len(lost)} utterances of {args.data_jsonl} are in no shard "
                           f"(first: {lost[:5]}); remove {shards} and decode again")
    with open(args.out / "ref.txt", "w", encoding="utf-8") as ref, \
            open(args.out / "hyp.txt", "w", encoding="utf-8") as hyp, \
            open(args.out / "ref_tags.tsv", "w", encoding="utf-8") as ref_tags:
        ref_tags.write("key\t" + "\t".join(TAG_COLUMNS) + "\n")
        for _, obj in refs:
            key = obj["key"]
            ref.write(f"{key} {obj.get('target', '')}".rstrip() + "\n")
            tags = (obj.get(field) for field in ("text_language", "emo_target", "event_target"))
            ref_tags.write("\t".join([key, *(bare_tag(t) for t in tags)]) + "\n")
            if "error" not in hyps[key]:
                hyp.write(f"{key} {hyps[key]['text']}".rstrip() + "\n")
    if any("language" in h for h in hyps.values()):
        with open(args.out / "hyp_tags.tsv", "w", encoding="utf-8") as f:
            f.write("key\t" + "\t".join((*TAG_COLUMNS, "itn")) + "\n")
            for _, obj in refs:
                h = hyps[obj["key"]]
                if "error" not in h:
                    f.write("\t".join([obj["key"], *(h.get(c, "") for c in (*TAG_COLUMNS, "itn"))]) + "\n")
    with open(args.out / "failed.tsv", "w", encoding="utf-8") as f:
        f.write(REJECTED_HEADER)
        for h in failed:
            f.write(Rejection(str(args.data_jsonl), h["line"], h["key"], h["error"], h["detail"]).tsv())
    audio_s = sum(s["audio_seconds"] for s in stats)
    decode_s = sum(s["decode_seconds"] for s in stats)
    summary = {"model": args.model_name, "set": args.set_name or args.data_jsonl.parent.name,
               "utterances": len(refs), "failed": len(failed), "audio_seconds": round(audio_s, 3),
               "decode_seconds": round(decode_s, 3), "rtf": round(decode_s / max(audio_s, 1e-9), 5),
               "processes": args.world_size, "device": stats[0]["device"]}
    (args.out / "decode.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if failed:
        log.warning("%d of %d utterances could not be read (listed in %s); scored as deletions",
                    len(failed), len(refs), args.out / "failed.tsv")
    log.info("%s: %d utterances merged from %d processes (RTF %.4f per process)", args.out, len(refs),
             args.world_size, summary["rtf"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("work", "merge"))
    parser.add_argument("--data-jsonl", type=Path, required=True, help="stage 0's data/<set>/data.jsonl")
    parser.add_argument("--out", type=Path, required=True, help="decode dir, e.g. exp/<tag>/decode_<set>")
    parser.add_argument("--world-size", type=int, default=1, help="processes of all nodes together")
    parser.add_argument("--model-dir", type=Path, help="work: model dir in the hub's layout")
    parser.add_argument("--rank", type=int, default=int(os.environ.get("RANK", 0)),
                        help="work: global rank, 0..world-size-1 (default: $RANK)")
    parser.add_argument("--device", default="cpu",
                        help="work: cpu, cuda (the node's GPU number $LOCAL_RANK) or cuda:<i>")
    parser.add_argument("--batch-size", type=int, default=32, help="work: utterances per batch at most")
    parser.add_argument("--batch-frames", type=int, default=30000,
                        help="work: padded 10 ms frames per batch at most (longest x utterances)")
    parser.add_argument("--model-name", default="model", help="merge: the model's name in the results")
    parser.add_argument("--set-name", help="merge: the set's name in the results (default: its folder)")
    parser.add_argument("--wait-timeout", type=float, default=7200, help="merge: seconds to wait for ranks")
    args = parser.parse_args(argv)
    setup_logging()
    if args.mode == "work" and args.model_dir is None:
        parser.error("work needs --model-dir")
    if args.device == "cuda":
        args.device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}"
    if not 0 <= args.rank < args.world_size:
        parser.error(f"--rank {args.rank} is not in 0..{args.world_size - 1}")
    try:
        work(args) if args.mode == "work" else merge(args)
    except (FileNotFoundError, RuntimeError, TimeoutError) as e:
        log.error("%s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
