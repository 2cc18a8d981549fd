"""Stage 0 validation of one Kaldi data dir (funasr_recipe/data/validate.py does the work), and the check
that no utterance is in two sets (funasr_recipe/data/overlap.py).

--set-dir: reads  <set-dir>/{wav.scp,text[,utt2spk,utt2lang,utt2emo,utt2event]} (any order, any size);
           writes <set-dir>/data.jsonl (accepted, sorted by key, SenseVoice schema), <set-dir>/rejected.tsv
           (file, line, key, reason, detail of every rejected entry) and <set-dir>/report.json (counts).
Nothing is dropped silently: entries = accepted + rejected; ``--strict true`` stops at the first bad
entry instead (exit 2). A set with no accepted entry fails (exit 1).

--overlap: reads  <data-dir>/<set>/data.jsonl of every set of --sets (after the --set-dir runs);
           writes <data-dir>/overlap.tsv: every utterance of a set that an earlier set holds too (the
           same key, or the same audio file). A warning says how many; ``--strict true`` makes them
           fatal (exit 2): the same utterance in train and dev makes the dev scores look better than
           they are.

--jsonl-to-kaldi: reads a set given as FunASR JSONL (.jsonl or .jsonl.gz: a --decode-dir, --replay-dir or
           --regression-dir); writes it as the Kaldi dir --set-dir (recipes/jsonl/prepare.py, the
           reader of --corpus jsonl), which the --set-dir mode then validates.

  .venv/bin/python -m local.prepare_data --set-dir data/train --language en --nj 2
  .venv/bin/python -m local.prepare_data --overlap --data-dir data --sets "train dev test" --strict false
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from funasr_recipe.core.cli import EXIT_FAILURE, program_parser, run_main, str2bool
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.overlap import OVERLAP_TSV, find_overlaps
from funasr_recipe.data.validate import validate_set

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> int:
    report = validate_set(args.set_dir, args.language, args.emotion, args.event, args.itn, args.nj,
                          args.strict, args.allow_pipes, args.max_duration)
    log.info("%s: %d entries, %d accepted, %d rejected %s; %.2f h; converted %s",
             args.set_dir, report["input_entries"], report["accepted"], report["rejected"],
             report["rejected_by_reason"], report["hours"], report["converted"])
    if report["rejected"]:
        log.warning("%d rejected utterances are listed in %s", report["rejected"],
                    args.set_dir / "rejected.tsv")
    if report["accepted"] == 0:
        log.error("%s: no utterance was accepted; see %s", args.set_dir, args.set_dir / "rejected.tsv")
        return EXIT_FAILURE
    return 0


def convert_jsonl(jsonl: Path, set_dir: Path) -> None:
    """A set given as FunASR JSONL -> a Kaldi dir, read as ``--corpus jsonl`` reads its files (every tag,
    speakers, start/end ranges kept), so a set is the same whichever option brings it."""
    from recipes.common import write_kaldi_set
    from recipes.funasr_jsonl import read_set

    log.info("%s: %d lines written as the Kaldi dir %s", jsonl, write_kaldi_set(set_dir, read_set(jsonl)),
             set_dir)


def run_overlap(data_dir: Path, sets: list[str], strict: bool) -> int:
    """find_overlaps, logged: INFO when no set shares an utterance, else a WARNING (BadInputError when
    strict) with the counts by kind and by pair, the file that lists them and the option."""
    counts = find_overlaps(data_dir, sets)
    listing = data_dir / OVERLAP_TSV
    total = sum(n for kinds in counts.values() for n in kinds.values())
    if total == 0:
        log.info("no utterance is in two of the sets %s (same key or same audio file); %s has the header "
                 "only", " ".join(sets), listing)
        return 0
    by_kind = {kind: sum(kinds[kind] for kinds in counts.values()) for kind in ("key", "audio")}
    pairs = "; ".join(f"{pair}: {kinds['key']} key, {kinds['audio']} audio"
                      for pair, kinds in counts.items() if any(kinds.values()))
    message = (f"{total} utterances are in two sets ({by_kind['key']} by the same key, {by_kind['audio']} "
               f"by the same audio file; {pairs}), listed in {listing}")
    if strict:
        raise BadInputError(f"strict mode: {message}")
    log.warning("%s; --strict true makes this fatal", message)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--set-dir", type=Path, help="Kaldi data dir to validate")
    parser.add_argument("--jsonl-to-kaldi", type=Path, help="instead: write this FunASR .jsonl[.gz] as the "
                        "Kaldi dir --set-dir")
    parser.add_argument("--overlap", action="store_true",
                        help="instead: look for utterances in two of --sets (under --data-dir)")
    parser.add_argument("--data-dir", type=Path, help="with --overlap: the dir of the sets' dirs")
    parser.add_argument("--sets", default="", help='with --overlap: set names, e.g. "train dev test"')
    parser.add_argument("--language", default="en", help="declared language of utterances without utt2lang")
    parser.add_argument("--emotion", default="NEUTRAL", help="declared emotion without utt2emo")
    parser.add_argument("--event", default="Speech", help="declared event without utt2event")
    parser.add_argument("--itn", default="woitn", help="withitn if transcripts keep punctuation and case")
    parser.add_argument("--nj", type=int, default=1, help="processes probing audio headers")
    parser.add_argument("--strict", type=str2bool, default=False,
                        help="stop at the first bad entry (with --overlap: at any overlap)")
    parser.add_argument("--allow-pipes", type=str2bool, default=False, help="accept 'cmd |' wav.scp entries")
    parser.add_argument("--max-duration", type=float, default=60.0, help="reject longer utterances (s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    sets = [s for s in re.split(r"[\s,]+", args.sets) if s]
    if args.overlap:
        if args.set_dir is not None or args.data_dir is None or not sets:
            parser.error("--overlap takes --data-dir and --sets, not --set-dir")
    elif args.set_dir is None:
        parser.error("the following arguments are required: --set-dir (or --overlap)")
    setup_logging()
    if args.jsonl_to_kaldi is not None:
        return run_main(lambda: convert_jsonl(args.jsonl_to_kaldi, args.set_dir), log)
    if args.overlap:
        return run_main(lambda: run_overlap(args.data_dir, sets, args.strict), log)
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    sys.exit(main())
