"""FunASR's fine-tuning JSONL (train.jsonl, val.jsonl) -> Kaldi data dirs.

Reads  <corpus-dir>/train.jsonl[.gz] (required) and every other <name>.jsonl[.gz] beside it;
writes <data-dir>/<set>/{wav.scp,text,utt2spk,spk2utt[,segments,utt2lang,utt2emo,utt2event,utt2itn]}
       and <data-dir>/corpus.json.

The lines are what FunASR's sense_voice finetune.sh reads and its scp2jsonl / sensevoice2jsonl tools
write: key, source (an audio path, or a Kaldi `cmd |` pipe), target, text_language, emo_target,
event_target, with_or_wo_itn (source_len and target_len are recomputed from the audio and the
tokenizer). Every tag is kept per utterance (utt2lang, utt2emo, utt2event, utt2itn), in the <|en|> form
or bare; the validator maps language names and codes and rejects unknown tags with the valid ones
listed. Also read where present: speaker or spk (else each utterance is its own speaker), and start
and end in seconds (the utterance is that range of its audio: written to segments, read as a range in
stage 1; `path` may stand for source). A relative path is made absolute against the directory this
runs in (run.sh's), as FunASR's own loader opens it. Fields of no use to training are ignored, named
once in the log. Nothing is dropped or repaired: a line without target is an empty transcript and a
missing file stays a path, both rejected and counted by the validator with file and line; a line
that is not an object with a string key without whitespace stops here naming file:line.

Sets: train.jsonl is train; the dev set is the first of dev, valid, validation, val (.jsonl[.gz]);
without one, --dev-speakers speakers are held out of train (by utterance when the lines carry no
speaker, with a warning: recipes/common.py hold_out_dev). Every set but train is decoded as a test set.

  .venv/bin/python -m recipes.jsonl.prepare --corpus-dir /path/to/funasr_data --data-dir data
"""

from __future__ import annotations

import re
from pathlib import Path

from funasr_recipe.data.corpus import CorpusInfo
from recipes.common import CorpusLayoutError
from recipes.funasr_jsonl import read_set
from recipes.user_data import (
    listing,
    own_main,
    set_names,
    write_own_sets,
)

JSONL = re.compile(r"^(?P<name>.+)\.jsonl(?:\.gz)?$")


def find_sets(corpus_dir: Path) -> dict[str, Path]:
    """{set name: its JSONL file} of the *.jsonl[.gz] files in corpus_dir."""
    if not corpus_dir.is_dir():
        raise CorpusLayoutError(f"expected a directory with train.jsonl (FunASR's format) at {corpus_dir}")
    files = sorted(p.name for p in corpus_dir.iterdir())
    found: dict[str, Path] = {}
    for name in files:
        if (m := JSONL.match(name)) and (corpus_dir / name).is_file():
            if m["name"] in found:
                raise CorpusLayoutError(f"{corpus_dir}: both {found[m['name']].name} and {name}; keep one")
            found[m["name"]] = corpus_dir / name
    if "train" not in found:
        raise CorpusLayoutError(f"expected {corpus_dir / 'train.jsonl'} (or train.jsonl.gz) in FunASR's "
                                f"format; found {listing(files)}")
    names = set_names(found)
    return {names[split]: path for split, path in found.items()}


def prepare(corpus_dir: Path, data_dir: Path, dev_speakers: int | None = None, **tags: str) -> CorpusInfo:
    """Write one Kaldi data dir per JSONL file of corpus_dir (a dev set held out if none), and corpus.json."""
    sets = {name: read_set(path) for name, path in find_sets(corpus_dir).items()}
    return write_own_sets("jsonl", corpus_dir, data_dir, sets, dev_speakers, **tags)


def main() -> None:
    """Command line entry point."""
    own_main(prepare, __doc__, "whose line has none")


if __name__ == "__main__":
    main()
