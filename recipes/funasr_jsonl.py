"""FunASR's fine-tuning JSONL lines -> recipe utterances: the one reader of that format, used by
``--corpus jsonl`` (recipes/jsonl/prepare.py) and by every set given as a .jsonl[.gz] to --decode-dir,
--replay-dir or --regression-dir (local/prepare_data.py --jsonl-to-kaldi), so a set is read the same
whichever option brings it.

Reads one JSONL file (gzipped or not); writes nothing. The fields and what becomes of them are in
recipes/jsonl/prepare.py's docstring.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from pathlib import Path

from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.data.tags import TAG_FIELDS, bare_tag
from recipes.common import CorpusLayoutError, Utt

log = logging.getLogger(__name__)

ITN_FIELD = "with_or_wo_itn"
# Read here, or recomputed by stage 0/1: not worth a word in the log.
KNOWN = {"key", "source", "path", "target", "source_len", "target_len", "speaker", "spk", "start", "end",
         ITN_FIELD, *TAG_FIELDS.values()}


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
