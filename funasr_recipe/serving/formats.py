"""The answer formats of the OpenAI-style endpoint: json, text, srt, vtt, verbose_json.

Reads and writes nothing: a transcription dict (app.py's) in, the body out.
"""

from __future__ import annotations

import re

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(max(0.0, seconds) * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def cues(result: dict) -> list[tuple[float, float, str]]:
    """(start, end, text) of each segment that has text."""
    return [(s["start"], s["end"], s["text"]) for s in result["segments"] if s["text"]]


def srt(result: dict) -> str:
    blocks = [f"{i}\n{_clock(a, ',')} --> {_clock(b, ',')}\n{text}\n"
              for i, (a, b, text) in enumerate(cues(result), 1)]
    return "\n".join(blocks)


def vtt(result: dict) -> str:
    blocks = [f"{_clock(a, '.')} --> {_clock(b, '.')}\n{text}\n" for a, b, text in cues(result)]
    return "WEBVTT\n\n" + "\n".join(blocks)


# Scripts written without spaces: each of their characters is a word of its own.
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def words(tokens: list[dict]) -> list[dict]:
    """OpenAI's ``words`` (word, start, end) from the service's timed tokens: a token that begins with
    "▁" (SentencePiece's word boundary) starts a word, the others continue it; a character of an
    unspaced script (CJK, kana, hangul) is a word of its own."""
    out: list[dict] = []
    joinable = False
    for t in tokens:
        piece = t["token"]
        unspaced = bool(_UNSPACED.match(piece.lstrip("▁")))
        text = piece.replace("▁", "")
        if not text:
            joinable = False  # a lone "▁": the next token starts a word
            continue
        if out and joinable and not piece.startswith("▁") and not unspaced:
            out[-1]["word"] += text
            out[-1]["end"] = t["end"]
        else:
            out.append({"word": text, "start": t["start"], "end": t["end"]})
        joinable = not unspaced
    return out
