"""The tag vocabulary of SenseVoice (language, emotion, event, text normalisation).

Names as the released SenseVoiceSmall tokenizer spells them (funasr/utils/postprocess_utils.py and
funasr/models/sense_voice/model.py, funasr 1.4.16). Tags are written in the JSONL as ``<|name|>``.
"""

from __future__ import annotations

LANGUAGES = ("zh", "en", "yue", "ja", "ko", "nospeech")
EMOTIONS = ("HAPPY", "SAD", "ANGRY", "NEUTRAL", "FEARFUL", "DISGUSTED", "SURPRISED", "EMO_UNKNOWN")
EVENTS = ("Speech", "BGM", "Applause", "Laughter", "Cry", "Sneeze", "Breath", "Cough", "Sing",
          "Speech_Noise", "Event_UNK")
ITN = ("withitn", "woitn")

_KINDS = {"language": LANGUAGES, "emotion": EMOTIONS, "event": EVENTS, "itn": ITN}


def canonical_tag(kind: str, value: str) -> str | None:
    """Return ``<|name|>`` for a tag given as ``name`` or ``<|name|>`` in any case; None if unknown.

    >>> canonical_tag("emotion", "happy")
    '<|HAPPY|>'
    """
    name = value.strip()
    if name.startswith("<|") and name.endswith("|>"):
        name = name[2:-2]
    by_lower = {n.lower(): n for n in _KINDS[kind]}
    found = by_lower.get(name.lower())
    return None if found is None else f"<|{found}|>"
