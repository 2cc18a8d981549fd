"""Stage 0 validation of one Kaldi data dir (funasr_recipe/data/validate.py does the work).

Reads  <set-dir>/{wav.scp,text[,utt2spk,utt2lang,utt2emo,utt2event]} (any order, any size);
writes <set-dir>/data.jsonl (accepted, sorted by key, SenseVoice schema), <set-dir>/rejected.tsv
(file, line, key, reason, detail of every rejected entry) and <set-dir>/report.json (counts).

Nothing is dropped silently: entries = accepted + rejected; ``--strict true`` stops at the first bad
entry instead (exit 2). A set with no accepted entry fails (exit 1).

  python -m local.prepare_data --set-dir data/train --language en --nj 2
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import EXIT_FAILURE, run_main, str2bool
from funasr_recipe.core.log import setup_logging
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set-dir", type=Path, required=True, help="Kaldi data dir to validate")
    parser.add_argument("--language", default="en", help="declared language of utterances without utt2lang")
    parser.add_argument("--emotion", default="NEUTRAL", help="declared emotion without utt2emo")
    parser.add_argument("--event", default="Speech", help="declared event without utt2event")
    parser.add_argument("--itn", default="woitn", help="withitn if transcripts keep punctuation and case")
    parser.add_argument("--nj", type=int, default=1, help="processes probing audio headers")
    parser.add_argument("--strict", type=str2bool, default=False, help="stop at the first bad entry")
    parser.add_argument("--allow-pipes", type=str2bool, default=False, help="accept 'cmd |' wav.scp entries")
    parser.add_argument("--max-duration", type=float, default=60.0, help="reject longer utterances (s)")
    args = parser.parse_args(argv)
    setup_logging()
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    sys.exit(main())
