"""speechocean762 (upstream layout) -> Kaldi data dirs, one per part.

Reads  <corpus-dir>/<part>/{wav.scp,text,utt2spk} for each --parts entry, with paths relative to
<corpus-dir> (WAVE/SPEAKERxxxx/xxx.WAV);
writes <data-dir>/<part>/{wav.scp,text,utt2spk,spk2utt} and <data-dir>/corpus.json.

This is what the corpus's Kaldi/ESPnet data prep does (egs/gop_speechocean762 local/data_prep.sh):
copy each part's files and put the corpus directory in front of the relative WAVE/ paths. Keys are
upstream's numeric ids (5-digit speaker + 4-digit utterance, e.g. 000750005 of speaker 0075), kept
as they are: they sort by speaker already. spk2gender/spk2age are not part of our data dir
contract and are not copied. Upstream ships "train test"; the shared subset ships "train dev".

  .venv/bin/python -m recipes.speechocean762.prepare --corpus-dir ../shared/data/speechocean762 \\
      --data-dir data
"""

from __future__ import annotations

from pathlib import Path

from funasr_recipe.data.corpus import CorpusInfo
from recipes.common import (
    CorpusLayoutError,
    read_kaldi_dir,
    recipe_parser,
    require,
    run_recipe,
    split_list,
    write_sets,
)

DEFAULT_PARTS = "train dev"


def prepare(corpus_dir: Path, data_dir: Path, parts: list[str] | None = None) -> CorpusInfo:
    """Write one set per part. Train set "train"; valid set "dev" if given, else the first other part;
    every part but train is a test set."""
    parts = parts if parts is not None else split_list(DEFAULT_PARTS)
    if "train" not in parts or len(parts) < 2:
        raise CorpusLayoutError(f"--parts must hold train and at least one more part, got {parts}")
    require(corpus_dir / "WAVE", "speechocean762's WAVE/ directory")
    sets = {part: read_kaldi_dir(require(corpus_dir / part, f"the Kaldi dir of part {part}"), root=corpus_dir)
            for part in parts}
    tests = [p for p in parts if p != "train"]
    info = CorpusInfo(corpus="speechocean762", corpus_dir=str(corpus_dir.resolve()), train_set="train",
                      valid_set="dev" if "dev" in tests else tests[0], test_sets=tests, language="en")
    return write_sets(data_dir, sets, info)


def main() -> None:
    """Command line entry point."""
    args = recipe_parser(__doc__, parts=DEFAULT_PARTS).parse_args()
    run_recipe(prepare, corpus_dir=args.corpus_dir, data_dir=args.data_dir, parts=split_list(args.parts))


if __name__ == "__main__":
    main()
