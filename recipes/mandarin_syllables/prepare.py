"""Mandarin isolated tonal syllables (two speakers, Kaldi-style layout) -> Kaldi data dirs, split by speaker.

Reads  <corpus-dir>/data/all/{wav.scp,text,utt2spk} (wav paths relative to <corpus-dir>, FLAC);
writes <data-dir>/{train,dev}/{wav.scp,text,utt2spk,spk2utt} and <data-dir>/corpus.json.

Each transcript is one toneful pinyin syllable (zhong1, lv4, de5). Paths are made absolute; FLAC is
kept as it is (the Python loaders read it). Keys are kept: they already start with the speaker.

  .venv/bin/python -m recipes.mandarin_syllables.prepare --corpus-dir ../shared/data/mandarin_syllables \\
      --data-dir data
"""

from __future__ import annotations

from pathlib import Path

from funasr_recipe.data.corpus import CorpusInfo
from recipes.common import (
    read_kaldi_dir,
    recipe_parser,
    require,
    run_recipe,
    split_by_speakers,
    split_list,
    write_sets,
)

# NOTE: gcin_liu is the dev speaker. With two speakers one of them must be the whole dev set, and
# training on cmn_chenwang (1707 clean clips, 1707 labels) covers all but 14 of gcin_liu's 1187
# labels, while the other way round 534 dev labels would never be seen in training. gcin_liu is
# also home-recorded (noisy, low level, ~0.4 s clips): a harder, more realistic dev set.
DEFAULT_DEV_SPEAKERS = "gcin_liu"


def prepare(corpus_dir: Path, data_dir: Path, dev_speakers: list[str] | None = None) -> CorpusInfo:
    """Write train (all other speakers) and dev (``dev_speakers``) from data/all."""
    dev_speakers = dev_speakers if dev_speakers is not None else split_list(DEFAULT_DEV_SPEAKERS)
    src = require(corpus_dir / "data" / "all", "the Kaldi dir data/all of mandarin_syllables")
    train, dev = split_by_speakers(read_kaldi_dir(src, root=corpus_dir), dev_speakers)
    info = CorpusInfo(corpus="mandarin_syllables", corpus_dir=str(corpus_dir.resolve()), train_set="train",
                      valid_set="dev", test_sets=["dev"], language="zh")
    return write_sets(data_dir, {"train": train, "dev": dev}, info)


def main() -> None:
    """Command line entry point."""
    parser = recipe_parser(__doc__, dev_speakers=DEFAULT_DEV_SPEAKERS)
    args = parser.parse_args()
    run_recipe(prepare, corpus_dir=args.corpus_dir, data_dir=args.data_dir,
               dev_speakers=split_list(args.dev_speakers))


if __name__ == "__main__":
    main()
