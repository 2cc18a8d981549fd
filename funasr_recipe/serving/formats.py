"""The answer formats of the OpenAI-style endpoint: json, text, srt, vtt, verbose_json.

Reads and writes nothing: a transcription dict (app.py's) in, the body out.
"""

from __future__ import annotations

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
