"""LibriSpeech (upstream layout) -> Kaldi data dirs: train (all train parts), dev (all dev parts) and one
set per dev/test part.

Reads  <corpus-dir>/LibriSpeech/<part>/<spk>/<chapter>/{<spk>-<chapter>-<utt>.flac, <spk>-<chapter>.trans.txt}
(--corpus-dir may also be LibriSpeech/ itself);
writes <data-dir>/{train,dev,dev_clean,test_clean,...}/{wav.scp,text,utt2spk,spk2utt} and
<data-dir>/corpus.json.

As Kaldi's (and ESPnet's) local/data_prep.sh: the key is the file name, the speaker is
<spk>-<chapter> (one "speaker" per reader and chapter), the text is the upper-case transcript, set
names are the part names with '-' replaced by '_'. Parts given but not on disk are skipped (logged);
at least one train-* and one dev-* part must be there. Where Kaldi stops at a flac without a
transcript line (or the reverse), this recipe leaves it out and logs each one by name.

  .venv/bin/python -m recipes.librispeech.prepare --corpus-dir /corpora --data-dir data \\
      --parts "train-clean-100 train-clean-360 dev-clean dev-other test-clean test-other"
"""

from __future__ import annotations

import logging
from pathlib import Path

from funasr_recipe.data.corpus import CorpusInfo
from recipes.common import (
    CorpusLayoutError,
    Utt,
    read_table,
    recipe_parser,
    run_recipe,
    split_list,
    write_sets,
)

log = logging.getLogger(__name__)

DEFAULT_PARTS = "train-clean-100 dev-clean test-clean test-other"
KINDS = ("train-", "dev-", "test-")


def find_root(corpus_dir: Path) -> Path:
    """The LibriSpeech directory: corpus_dir itself when it holds a part, else corpus_dir/LibriSpeech."""
    if any(p.is_dir() and p.name.startswith(KINDS) for p in corpus_dir.glob("*-*")):
        return corpus_dir
    return corpus_dir / "LibriSpeech"


def read_part(part_dir: Path) -> list[Utt]:
    """Utterances of one part; flacs without transcript and transcript lines without flac are logged."""
    utts, no_text, no_audio = [], [], []
    for chapter_dir in sorted(p for p in part_dir.glob("*/*") if p.is_dir()):
        speaker = f"{chapter_dir.parent.name}-{chapter_dir.name}"
        trans = chapter_dir / f"{speaker}.trans.txt"
        text = dict(read_table(trans)) if trans.is_file() else {}
        flacs = {p.stem: p for p in chapter_dir.glob("*.flac")}
        no_text += sorted(flacs.keys() - text.keys())
        no_audio += sorted(text.keys() - flacs.keys())
        utts += [Utt(key, str(flacs[key].resolve()), text[key], speaker)
                 for key in sorted(flacs.keys() & text.keys())]
    if no_text:
        log.warning("%s: %d flac files have no transcript line and are left out: %s", part_dir, len(no_text),
                    " ".join(no_text))
    if no_audio:
        log.warning("%s: %d transcript lines have no flac file and are left out: %s", part_dir, len(no_audio),
                    " ".join(no_audio))
    return utts


def prepare(corpus_dir: Path, data_dir: Path, parts: list[str] | None = None) -> CorpusInfo:
    """Write train (union of train parts), dev (union of dev parts) and each dev/test part as a set."""
    parts = list(dict.fromkeys(parts if parts is not None else split_list(DEFAULT_PARTS)))
    if bad := [p for p in parts if not p.startswith(KINDS)]:
        raise CorpusLayoutError(f"unknown LibriSpeech parts {bad}: names start with train-, dev- or test-")
    root = find_root(corpus_dir)
    present = [p for p in parts if (root / p).is_dir()]
    for part in sorted(set(parts) - set(present)):
        log.info("%s is not there; part %s skipped", root / part, part)
    for kind in ("train-", "dev-"):
        if not any(p.startswith(kind) for p in present):
            raise CorpusLayoutError(f"no {kind}* part of {parts} found: expected e.g. {root / kind}clean* "
                                    "(is --corpus-dir the dir holding LibriSpeech/?)")
    by_part = {part: read_part(root / part) for part in present}
    sets = {"train": [u for p in present if p.startswith("train-") for u in by_part[p]],
            "dev": [u for p in present if p.startswith("dev-") for u in by_part[p]]}
    tests = [p.replace("-", "_") for p in present if not p.startswith("train-")]
    sets.update({p.replace("-", "_"): by_part[p] for p in present if not p.startswith("train-")})
    info = CorpusInfo(corpus="librispeech", corpus_dir=str(root.resolve()), train_set="train",
                      valid_set="dev", test_sets=tests, language="en")
    return write_sets(data_dir, sets, info)


def main() -> None:
    """Command line entry point."""
    args = recipe_parser(__doc__, parts=DEFAULT_PARTS).parse_args()
    run_recipe(prepare, corpus_dir=args.corpus_dir, data_dir=args.data_dir, parts=split_list(args.parts))


if __name__ == "__main__":
    main()
