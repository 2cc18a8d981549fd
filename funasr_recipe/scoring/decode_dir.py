"""A decode dir: what decoding hands to scoring. Each rank writes a shard; node 0 merges them.

Shards, per rank (``decode_shard``, which local/decode.py work runs on the rank's utterances):
  <out>/shards/<rank>.jsonl       one line per utterance of the rank: ``hyp_record`` (raw model output,
                                  tags, text without tags, seconds) or ``error_record`` (the audio error)
  <out>/shards/<rank>.stats.json  audio and decoding seconds, device
  <out>/shards/<rank>.done        the marker of a finished shard (dist/markers.py)
Merged (``merge_decode_dir``, node 0), what scoring/score.py reads:
  <out>/{ref.txt, hyp.txt, ref_tags.tsv, hyp_tags.tsv (SenseVoice), failed.tsv, decode.json}
An utterance whose audio could not be read is listed in failed.tsv with file, line and key and left out
of hyp.txt, so the scorer counts it as deletions and names it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from funasr_recipe.core.jsonl import read_jsonl
from funasr_recipe.core.log import Progress
from funasr_recipe.core.rejections import REJECTED_HEADER, Rejection
from funasr_recipe.data.batching import consecutive_batches
from funasr_recipe.data.tags import KINDS, TAG_FIELDS, TAG_KINDS, bare_tag, split_tags
from funasr_recipe.dist.markers import wait_for_shards
from funasr_recipe.features.audio import AudioError

if TYPE_CHECKING:
    from funasr_recipe.model.inference import TorchASR

log = logging.getLogger(__name__)


def shard_file(out: Path, rank: int, suffix: str) -> Path:
    """``<out>/shards/<rank>.<suffix>``: jsonl, stats.json or done."""
    return out / "shards" / f"{rank}.{suffix}"


def hyp_record(key: str, raw: str, seconds: float, emits_tags: bool) -> dict:
    """A shard line of a decoded utterance: its raw output, its text without tags and its tags by kind
    (a tag SenseVoice did not emit is "none": scored as wrong, not skipped)."""
    tags, text = split_tags(raw)
    if emits_tags:
        tags = {kind: tags.get(kind, "none") for kind in KINDS} | tags
    return {"key": key, "raw": raw, "text": text, **tags, "seconds": seconds}


def error_record(rejection: Rejection) -> dict:
    """A shard line of an utterance whose audio could not be read."""
    return {"key": rejection.key, "line": rejection.line, "error": rejection.reason,
            "detail": rejection.detail}


def decode_shard(asr: TorchASR, items: list[tuple[int, dict]], data_jsonl: Path, out: Path, rank: int,
                 device: str, max_utts: int, max_frames: int, scored: bool = False) -> dict:
    """Decode one rank's (line, manifest entry) items in batches of at most ``max_utts`` utterances and
    ``max_frames`` padded frames; write its shard jsonl and stats.json; returns the stats. ``scored``
    adds each hypothesis's ``logprob`` and ``n_tokens`` (TorchASR.transcribe_scored: pseudo-labels)."""
    progress = Progress(f"decode {data_jsonl.parent.name} rank {rank}", len(items), logger=log)
    audio_s = decode_s = 0.0
    with open(shard_file(out, rank, "jsonl"), "w", encoding="utf-8") as f:
        lengths = [int(obj.get("source_len", 0)) for _, obj in items]
        for batch in consecutive_batches(lengths, max_utts, max_frames):
            waves, keys = [], []
            for lineno, obj in (items[i] for i in batch):
                try:
                    waves.append(asr.wave(obj["source"]))
                    keys.append(obj["key"])
                except AudioError as e:
                    rejection = Rejection(str(data_jsonl), lineno, obj["key"], e.reason, e.detail)
                    log.error("%s", rejection.message())
                    f.write(json.dumps(error_record(rejection), ensure_ascii=False) + "\n")
            if waves:
                start = time.perf_counter()
                results = (asr.transcribe_scored(waves, keys) if scored
                           else [(text, None, None) for text in asr.transcribe(waves, keys)])
                decode_s += time.perf_counter() - start
                for key, wave, (text, logprob, n_tokens) in zip(keys, waves, results, strict=True):
                    audio_s += len(wave) / asr.fs
                    record = hyp_record(key, text, len(wave) / asr.fs, asr.emits_tags)
                    if scored:
                        record |= {"logprob": logprob, "n_tokens": n_tokens}
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
            progress.update(len(batch))
    progress.close()
    stats = {"audio_seconds": audio_s, "decode_seconds": decode_s, "device": device}
    shard_file(out, rank, "stats.json").write_text(json.dumps(stats))
    return stats


def merge_decode_dir(out: Path, data_jsonl: Path, world_size: int, model_name: str, set_name: str,
                     timeout: float) -> dict:
    """Wait for every rank's shard, then write the merged files; returns decode.json's summary."""
    wait_for_shards(lambda r: shard_file(out, r, "done").is_file(), world_size, world_size,
                    f"decode {out}", timeout)
    refs = sorted(read_jsonl(data_jsonl), key=lambda it: it[1]["key"])
    hyps: dict[str, dict] = {}
    for rank in range(world_size):
        for _, obj in read_jsonl(shard_file(out, rank, "jsonl")):
            hyps[obj["key"]] = obj
    stats = [json.loads(shard_file(out, r, "stats.json").read_text()) for r in range(world_size)]
    failed = [hyps[o["key"]] for _, o in refs if "error" in hyps.get(o["key"], {})]
    lost = [o["key"] for _, o in refs if o["key"] not in hyps]
    if lost:  # a shard that misses utterances is a bug or a changed data.jsonl, not a bad file
        raise RuntimeError(f"{out}: {len(lost)} utterances of {data_jsonl} are in no shard "
                           f"(first: {lost[:5]}); remove {out / 'shards'} and decode again")
    with open(out / "ref.txt", "w", encoding="utf-8") as ref, \
            open(out / "hyp.txt", "w", encoding="utf-8") as hyp, \
            open(out / "ref_tags.tsv", "w", encoding="utf-8") as ref_tags:
        ref_tags.write("key\t" + "\t".join(TAG_KINDS) + "\n")
        for _, obj in refs:
            key = obj["key"]
            ref.write(f"{key} {obj.get('target', '')}".rstrip() + "\n")
            ref_tags.write("\t".join([key, *(bare_tag(obj.get(TAG_FIELDS[k])) for k in TAG_KINDS)]) + "\n")
            if "error" not in hyps[key]:
                hyp.write(f"{key} {hyps[key]['text']}".rstrip() + "\n")
    if any("language" in h for h in hyps.values()):
        with open(out / "hyp_tags.tsv", "w", encoding="utf-8") as f:
            f.write("key\t" + "\t".join((*TAG_KINDS, "itn")) + "\n")
            for _, obj in refs:
                h = hyps[obj["key"]]
                if "error" not in h:
                    f.write("\t".join([obj["key"], *(h.get(c, "") for c in (*TAG_KINDS, "itn"))]) + "\n")
    with open(out / "failed.tsv", "w", encoding="utf-8") as f:
        f.write(REJECTED_HEADER)
        for h in failed:
            f.write(Rejection(str(data_jsonl), h["line"], h["key"], h["error"], h["detail"]).tsv())
    audio_s = sum(s["audio_seconds"] for s in stats)
    decode_s = sum(s["decode_seconds"] for s in stats)
    summary = {"model": model_name, "set": set_name, "utterances": len(refs), "failed": len(failed),
               "audio_seconds": round(audio_s, 3), "decode_seconds": round(decode_s, 3),
               "rtf": round(decode_s / max(audio_s, 1e-9), 5), "processes": world_size,
               "device": stats[0]["device"]}
    (out / "decode.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if failed:
        log.warning("%d of %d utterances could not be read (listed in %s); scored as deletions",
                    len(failed), len(refs), out / "failed.tsv")
    log.info("%s: %d utterances merged from %d processes (RTF %.4f per process)", out, len(refs), world_size,
             summary["rtf"])
    return summary
