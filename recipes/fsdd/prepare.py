"""Free Spoken Digit Dataset (FSDD) -> Kaldi data dirs, split by speaker.

Reads  <corpus-dir>/recordings/{digit}_{speaker}_{index}.wav (the upstream layout; default: the copy
bundled with this repo, corpora/free-spoken-digit-dataset);
writes <data-dir>/{train,dev}/{wav.scp,text,utt2spk,spk2utt} and <data-dir>/corpus.json, and
       <data-dir>/test/ too with --test-speakers (then decoded as a test set beside dev).

The transcript is the digit as an upper-case English word (7 -> SEVEN): each digit word then is one
token of the tokenizer, which the tiny models need (docs/design.md, "Tiny models on the digit
corpus"). The key is ``{speaker}-{digit}_{speaker}_{index}``. Upstream's own split (takes 0-4 =
test) shares speakers between train and test, so the dev set is whole held-out speakers instead. A file in
recordings/ whose name does not match the pattern is left out and logged by name.

  .venv/bin/python -m recipes.fsdd.prepare --data-dir data --dev-speakers theo
  .venv/bin/python -m recipes.fsdd.prepare --data-dir data --dev-speakers none --test-speakers theo

A test speaker is one that neither trains nor chooses checkpoints (the dev set's validation loss does
that): bench/bench_loso.py holds out each speaker in turn as the test set this way.
"""

from __future__ import annotations

import logging
from pathlib import Path

from funasr_recipe.data.corpus import CorpusInfo
from recipes.common import (
    CorpusLayoutError,
    Utt,
    recipe_parser,
    require,
    run_recipe,
    split_by_speakers,
    split_list,
    write_sets,
)
from recipes.fsdd import BUNDLED, NAME, WORDS

log = logging.getLogger(__name__)

# NOTE: theo has a neutral US accent: a held-out speaker whose error rate measures generalisation to
# a new voice, while the accented speakers (Greek, German, French) stay in training, where their
# variety helps most. An accented unseen speaker is far harder (~32% vs ~12% WER: docs/design.md,
# "Tiny models on the digit corpus").
DEFAULT_DEV_SPEAKERS = "theo"
# --dev-speakers none: dev holds the training speakers' recordings whose index is a multiple of this
# (10%, every digit alike), so that with one test speaker the other four all train (bench/bench_loso.py).
DEV_EVERY = 10


def prepare(corpus_dir: Path, data_dir: Path, dev_speakers: list[str] | None = None,
            test_speakers: list[str] | None = None) -> CorpusInfo:
    """Write train (all other speakers), dev (``dev_speakers``; ``["none"]``: every DEV_EVERY-th
    recording of the training speakers) and, when given, test (``test_speakers``) from FSDD's
    recordings/."""
    dev_speakers = dev_speakers if dev_speakers is not None else split_list(DEFAULT_DEV_SPEAKERS)
    recordings = require(corpus_dir / "recordings", "FSDD's recordings/ directory")
    utts, index, skipped = [], {}, []
    for path in sorted(recordings.iterdir()):
        m = NAME.match(path.name)
        if m is None or not path.is_file():
            skipped.append(path.name)
            continue
        digit, speaker, _ = m.groups()
        utts.append(Utt(f"{speaker}-{path.stem}", str(path.resolve()), WORDS[int(digit)], speaker))
        index[utts[-1].key] = int(m.group(3))
    if skipped:
        log.warning("%s: %d entries do not match {digit}_{speaker}_{index}.wav and were left out: %s",
                    recordings, len(skipped), " ".join(skipped))
    if not utts:
        raise CorpusLayoutError(f"no {{digit}}_{{speaker}}_{{index}}.wav file in {recordings}")
    if overlap := sorted(set(dev_speakers) & set(test_speakers or [])):
        raise CorpusLayoutError(f"speakers {overlap} are both dev and test speakers")
    sets = {}
    if test_speakers:
        utts, sets["test"] = split_by_speakers(utts, test_speakers, role="test")
    if dev_speakers == ["none"]:
        sets["train"] = [u for u in utts if index[u.key] % DEV_EVERY]
        sets["dev"] = [u for u in utts if not index[u.key] % DEV_EVERY]
    else:
        sets["train"], sets["dev"] = split_by_speakers(utts, dev_speakers)
    info = CorpusInfo(corpus="fsdd", corpus_dir=str(corpus_dir.resolve()), train_set="train",
                      valid_set="dev", test_sets=["dev", *(["test"] if test_speakers else [])],
                      language="en")
    return write_sets(data_dir, sets, info)


def main() -> None:
    """Command line entry point."""
    parser = recipe_parser(__doc__, default_corpus_dir=BUNDLED, dev_speakers=DEFAULT_DEV_SPEAKERS)
    parser.add_argument("--test-speakers", default="", help="speakers held out as a test set, comma "
                        "separated; they neither train nor choose checkpoints (default: none)")
    args = parser.parse_args()
    run_recipe(prepare, corpus_dir=args.corpus_dir, data_dir=args.data_dir,
               dev_speakers=split_list(args.dev_speakers), test_speakers=split_list(args.test_speakers))


if __name__ == "__main__":
    main()
