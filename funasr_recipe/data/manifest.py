"""The data.jsonl manifest of a set: stage 0 writes it, stage 1 derives its feature manifest from it, and
decoding, parity and the benchmark read their utterances from it.

One JSON object per line, funasr's SenseVoice schema (key, source, source_len in 10 ms frames, target,
target_len, text_language, emo_target, event_target, with_or_wo_itn) plus ``speaker`` and, from stage
0, the audio's ``sample_rate`` and ``channels`` (stage 1 drops these: they describe the audio, not the
features). ``source`` is an absolute audio path or a Kaldi pipe (``cmd |``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.features.audio import AudioInfo, is_pipe


def manifest_line(key: str, source: str, info: AudioInfo, transcript: str, tags: dict[str, str | None],
                  itn: str | None, speaker: str) -> str:
    """One line of a stage-0 data.jsonl; ``tags`` holds the ``<|name|>`` of language, emotion, event."""
    # Whitespace only: each run of tabs, NBSPs or other Unicode spaces becomes one space. Case and Unicode
    # form are the model's choice, made in stage 1 (data/textnorm.py; docs/text_normalisation.md).
    target = " ".join(transcript.split())
    obj = {
        "key": key,
        # Absolute, so that training finds the audio from any working directory.
        "source": source if is_pipe(source) else os.path.abspath(source),
        "source_len": int(info.duration * 100),
        "target": target,
        # funasr's own scp2jsonl counts words when there are spaces, else characters.
        "target_len": len(target.split()) if " " in target else len(target),
        "text_language": tags["language"],
        "emo_target": tags["emotion"],
        "event_target": tags["event"],
        "with_or_wo_itn": itn,
        "speaker": speaker,
        "sample_rate": info.sample_rate,
        "channels": info.channels,
    }
    return json.dumps(obj, ensure_ascii=False) + "\n"


def read_utterances(jsonl: Path, max_utts: int | None = None) -> list[dict]:
    """{key, source, target, lang} of the first ``max_utts`` lines (all for None) of a data.jsonl;
    ValueError naming file:line on a line without key or source, or when there is none."""
    utts = []
    for lineno, obj in iter_jsonl(jsonl):
        if "key" not in obj or "source" not in obj:
            raise BadInputError(f"{jsonl}:{lineno}: not a data.jsonl line with key and source")
        utts.append({"key": str(obj["key"]), "source": str(obj["source"]),
                     "target": str(obj.get("target", "")), "lang": obj.get("text_language")})
        if max_utts and len(utts) >= max_utts:
            break
    if not utts:
        raise BadInputError(f"{jsonl}: no utterances")
    return utts
