"""AISHELL-1 (upstream layout) -> Kaldi data dirs train, dev, test.

Reads  <corpus-dir>/data_aishell/wav/{train,dev,test}/<speaker>/<uttid>.wav (the speaker archives
already extracted) and <corpus-dir>/data_aishell/transcript/aishell_transcript_v0.8.txt; --corpus-dir
may also be data_aishell/ itself;
writes <data-dir>/{train,dev,test}/{wav.scp,text,utt2spk,spk2utt} and <data-dir>/corpus.json.

As WeNet's and Kaldi's local/aishell_data_prep.sh: the key is the upstream utterance id
(BAC009S0002W0122, which holds the speaker S0002 and so sorts by speaker), the speaker is the
directory name, and the text is the transcript with its word-separating spaces removed. A wav that
has no transcript line is left out, as upstream does; unlike upstream, each one is counted and
logged by name.

  .venv/bin/python -m recipes.aishell1.prepare --corpus-dir /corpora/aishell --data-dir data
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
    require,
    run_recipe,
    write_sets,
)

log = logging.getLogger(__name__)

PARTS = ("train", "dev", "test")
TRANSCRIPT = Path("transcript") / "aishell_transcript_v0.8.txt"


def find_root(corpus_dir: Path) -> Path:
    """The data_aishell directory: corpus_dir itself or its data_aishell/ subdirectory."""
    if (corpus_dir / "wav").is_dir() and (corpus_dir / TRANSCRIPT).is_file():
        return corpus_dir
    return corpus_dir / "data_aishell"


def prepare(corpus_dir: Path, data_dir: Path) -> CorpusInfo:
    """Write train, dev and test from the extracted AISHELL-1 wav/ tree and its transcript."""
    root = find_root(corpus_dir)
    transcript = require(root / TRANSCRIPT, "the AISHELL-1 transcript")
    text = {key: "".join(words.split()) for key, words in read_table(transcript)}
    sets: dict[str, list[Utt]] = {}
    for part in PARTS:
        part_dir = require(root / "wav" / part, f"the extracted AISHELL-1 {part} audio")
        wavs = sorted(p for p in part_dir.rglob("*") if p.suffix.lower() == ".wav" and p.is_file())
        if not wavs:
            archives = sorted(p.name for p in (root / "wav").glob("*.tar.gz"))
            hint = (f"; extract the speaker archives first ({', '.join(archives[:3])} ...), as WeNet's "
                    "local/download_and_untar.sh does" if archives else "")
            raise CorpusLayoutError(f"no .wav under {part_dir}{hint}")
        untranscribed = [p for p in wavs if p.stem not in text]
        if untranscribed:
            log.warning("%s: %d wavs have no line in %s and are left out (as upstream's data prep does): %s",
                        part_dir, len(untranscribed), transcript, " ".join(p.stem for p in untranscribed))
        sets[part] = [Utt(p.stem, str(p.resolve()), text[p.stem], p.parent.name)
                      for p in wavs if p.stem in text]
    unused = text.keys() - {u.key for utts in sets.values() for u in utts}
    log.info("%s: %d transcript lines have no wav (normal for a subset)", transcript, len(unused))
    info = CorpusInfo(corpus="aishell1", corpus_dir=str(root.resolve()), train_set="train", valid_set="dev",
                      test_sets=["dev", "test"], language="zh")
    return write_sets(data_dir, sets, info)


def main() -> None:
    """Command line entry point."""
    args = recipe_parser(__doc__).parse_args()
    run_recipe(prepare, corpus_dir=args.corpus_dir, data_dir=args.data_dir)


if __name__ == "__main__":
    main()
