"""Pseudo-labels: transcribe audio whose transcripts are gone with the pretrained model, keep the confident
hypotheses (tags included) as a Kaldi dir that stage 0 takes as a replay set (issue #17).

Reads  <model-dir> in the hub's layout (the model fine-tuned from) and <dir>/wav.scp (+ utt2spk);
writes (work)  <out>/shards/<rank>.{jsonl,stats.json,done}: this rank's utterances (dealt by key, decoded
               longest first in batches), each with its hypothesis, tags, mean log-probability of the
               emitted tokens and their number (funasr_recipe/scoring/decode_dir.py, scored); an
               unreadable audio file is reported with file, line and key and counted, not fatal;
       (merge) <dest>/{wav.scp,text,utt2spk[,utt2lang,utt2emo,utt2event]} of the kept utterances and
               <out>/{left_out.tsv,pseudo_label.json}: the left-out ones (unreadable, empty hypothesis,
               mean log-probability below --min-logprob) with the reason, and the counts
               (funasr_recipe/data/replay.py). None kept is an error (exit 2).
A family whose inference has no CTC (Paraformer) gives no score: merge keeps its non-empty hypotheses
and says so.

  .venv/bin/python -m local.pseudo_label work --model-dir exp/pretrained --wav-scp untranscribed/wav.scp \\
      --out exp/x/pseudo_untranscribed --rank 0 --world-size 2
  .venv/bin/python -m local.pseudo_label merge --wav-scp untranscribed/wav.scp \\
      --out exp/x/pseudo_untranscribed --world-size 2 --min-logprob -0.3 --dest data/pseudo_untranscribed
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import add_shard_work_options, check_shard_work_options, program_parser, run_main
from funasr_recipe.core.jsonl import read_jsonl
from funasr_recipe.core.log import setup_logging
from funasr_recipe.data.replay import merge_pseudo_labels, wav_scp_items
from funasr_recipe.dist.markers import fingerprint, is_done, mark_done, wait_for_shards
from funasr_recipe.dist.slicing import deal
from funasr_recipe.features.audio import AudioError, probe_audio
from funasr_recipe.scoring.decode_dir import decode_shard, shard_file

log = logging.getLogger(__name__)


def frames(source: str) -> int:
    """10 ms frames of an entry by its header (0 when unreadable: decoding then reports it)."""
    try:
        return int(probe_audio(source).duration * 100)
    except AudioError:
        return 0


def work(args: argparse.Namespace) -> None:
    (args.out / "shards").mkdir(parents=True, exist_ok=True)
    done = shard_file(args.out, args.rank, "done")
    fp = fingerprint("pseudo-label", args.world_size, files=[args.model_dir / "model.pt",
                                                             args.model_dir / "config.yaml", args.wav_scp])
    if is_done(done, fp):
        log.info("%s: rank %d is done; skipping", args.out, args.rank)
        return
    # Dealt by key alone, so that no rank reads another's audio headers; this rank's own are read to
    # batch its utterances longest first under --batch-frames.
    mine = deal(wav_scp_items(args.wav_scp), args.rank, args.world_size, size=lambda it: 0,
                key=lambda it: it[1]["key"])
    for _, item in mine:
        item["source_len"] = frames(item["source"])
    mine.sort(key=lambda it: -it[1]["source_len"])
    from funasr_recipe.model.inference import TorchASR  # funasr and torch: seconds to import

    asr = TorchASR(args.model_dir, args.device)
    if not asr.scored:
        log.warning("%s decodes without CTC: its hypotheses get no confidence, merge keeps every non-empty "
                    "one", asr.family)
    stats = decode_shard(asr, mine, args.wav_scp, args.out, args.rank, args.device, args.batch_size,
                         args.batch_frames, scored=True)
    mark_done(done, fp)
    log.info("rank %d: %d utterances, %.1f s of audio in %.1f s", args.rank, len(mine),
             stats["audio_seconds"], stats["decode_seconds"])


def merge(args: argparse.Namespace) -> None:
    wait_for_shards(lambda r: shard_file(args.out, r, "done").is_file(), args.world_size, args.world_size,
                    f"pseudo-labels {args.out}", args.wait_timeout)
    shards = (obj for r in range(args.world_size) for _, obj in read_jsonl(shard_file(args.out, r, "jsonl")))
    merge_pseudo_labels(shards, args.wav_scp, args.min_logprob, args.dest, args.out)


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("mode", choices=("work", "merge"))
    parser.add_argument("--wav-scp", type=Path, required=True,
                        help="wav.scp of the audio to label (its dir's utt2spk is used when present)")
    parser.add_argument("--out", type=Path, required=True, help="work dir: shards, left_out.tsv, counts")
    add_shard_work_options(parser)
    parser.add_argument("--model-dir", type=Path, help="work: the pretrained model dir (hub layout)")
    parser.add_argument("--min-logprob", type=float, default=-1.0,
                        help="merge: leave out hypotheses whose mean log-probability per emitted token is "
                        "below this (0 is certain; -1 is a mean probability of e^-1 = 0.37)")
    parser.add_argument("--dest", type=Path, help="merge: the Kaldi dir to write the kept ones to")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if args.mode == "work" and args.model_dir is None:
        parser.error("work needs --model-dir")
    if args.mode == "merge" and args.dest is None:
        parser.error("merge needs --dest")
    check_shard_work_options(parser, args)
    return run_main(lambda: work(args) if args.mode == "work" else merge(args), log)


if __name__ == "__main__":
    sys.exit(main())
