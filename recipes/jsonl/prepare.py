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

  python -m recipes.jsonl.prepare --corpus-dir /path/to/funasr_data --data-dir data
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from pathlib import Path

from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.data.corpus import CorpusInfo
from funasr_recipe.data.tags import TAG_FIELDS, bare_tag
from recipes.common import CorpusLayoutError, Utt
from recipes.user_data import (
    listing,
    own_main,
    set_names,
    write_own_sets,
)

log = logging.getLogger(__name__)

JSONL = re.compile(r"^(?P<name>.+)\.jsonl(?:\.gz)?$")
ITN_FIELD = "with_or_wo_itn"
# Read here, or recomputed by stage 0/1: not worth a word in the log.
KNOWN = {"key", "source", "path", "target", "source_len", "target_len", "speaker", "spk", "start", "end",
         ITN_FIELD, *TAG_FIELDS.values()}


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


def recording_id(path: str) -> str:
    """A stable wav.scp key for an audio path: its stem (as a key) and 8 hex digits of its hash."""
    stem = re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(path.split()[0] if path else "audio").stem)[:40]
    return f"{stem}-{hashlib.sha1(path.encode()).hexdigest()[:8]}"


def seconds(value: object, field: str, where: str) -> float:
    """A start/end field as seconds; anything else stops naming the line."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise CorpusLayoutError(f"{where}: {field} must be a number of seconds, not {value!r}")
    try:
        return float(value)
    except ValueError:
        raise CorpusLayoutError(f"{where}: {field} must be a number of seconds, not {value!r}") from None


def utterance(obj: dict, where: str) -> Utt:
    """The utterance of one JSONL line (``where`` is its file:line)."""
    key = obj.get("key")
    if not isinstance(key, str) or not key.strip() or any(c.isspace() for c in key):
        raise CorpusLayoutError(f"{where}: key must be a string without whitespace, not {key!r}")
    audio = obj.get("source", obj.get("path"))
    if not isinstance(audio, str):
        raise CorpusLayoutError(f"{where}: {key} has no source (or path) string, but {audio!r}")
    if not audio.rstrip().endswith("|") and not Path(audio).is_absolute() and "://" not in audio:
        audio = str(Path(audio).absolute())  # as funasr opens it: relative to the working directory
    target = obj.get("target", "")
    if not isinstance(target, str):
        raise CorpusLayoutError(f"{where}: {key} has a target that is not a string: {target!r}")
    tags = {kind: bare_tag(str(obj[field])) or None for kind, field in TAG_FIELDS.items() if obj.get(field)}
    speaker = obj.get("speaker", obj.get("spk"))
    itn = bare_tag(str(obj[ITN_FIELD])) if obj.get(ITN_FIELD) else None
    utt = Utt(key=key, path=audio, text=" ".join(target.split()), speaker=str(speaker) if speaker else key,
              itn=itn, recording=recording_id(audio), **tags)
    if "start" in obj or "end" in obj:
        utt.start = seconds(obj.get("start", 0.0), "start", where)
        utt.end = seconds(obj["end"], "end", where) if obj.get("end") is not None else -1.0
    return utt


def read_set(path: Path) -> list[Utt]:
    """The utterances of one FunASR JSONL file, in file order; logs the fields it does not read."""
    utts, unread = [], Counter()
    for lineno, obj in iter_jsonl(path):
        utts.append(utterance(obj, f"{path}:{lineno}"))
        unread.update(set(obj) - KNOWN)
    if not utts:
        raise CorpusLayoutError(f"{path}: no lines")
    if unread:
        log.info("%s: fields not used for training: %s", path,
                 ", ".join(f"{f} ({n} lines)" for f, n in sorted(unread.items())))
    log.info("%s: %d utterances, %d with a speaker of their own", path, len(utts),
             sum(u.speaker != u.key for u in utts))
    return utts


def prepare(corpus_dir: Path, data_dir: Path, dev_speakers: int | None = None, **tags: str) -> CorpusInfo:
    """Write one Kaldi data dir per JSONL file of corpus_dir (a dev set held out if none), and corpus.json."""
    sets = {name: read_set(path) for name, path in find_sets(corpus_dir).items()}
    return write_own_sets("jsonl", corpus_dir, data_dir, sets, dev_speakers, **tags)


def main() -> None:
    """Command line entry point."""
    own_main(prepare, __doc__, "whose line has none")


if __name__ == "__main__":
    main()
