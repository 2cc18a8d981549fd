"""The tag vocabulary of SenseVoice (language, emotion, event, text normalisation).

Names as the released SenseVoiceSmall tokenizer spells them (funasr/utils/postprocess_utils.py and
funasr/models/sense_voice/model.py, funasr 1.4.16). Tags are written in the JSONL as ``<|name|>``.
"""

from __future__ import annotations

import re

LANGUAGES = ("zh", "en", "yue", "ja", "ko", "nospeech")
EMOTIONS = ("HAPPY", "SAD", "ANGRY", "NEUTRAL", "FEARFUL", "DISGUSTED", "SURPRISED", "EMO_UNKNOWN")
EVENTS = ("Speech", "BGM", "Applause", "Laughter", "Cry", "Sneeze", "Breath", "Cough", "Sing",
          "Speech_Noise", "Event_UNK")
ITN = ("withitn", "woitn")

KINDS = {"language": LANGUAGES, "emotion": EMOTIONS, "event": EVENTS, "itn": ITN}
# The tags that are scored (accuracy per kind) and carried in ref_tags.tsv/hyp_tags.tsv; itn is a request
# to the model, not something it recognises.
TAG_KINDS = ("language", "emotion", "event")
# The data.jsonl field of each scored kind (funasr's SenseVoice schema).
TAG_FIELDS = {"language": "text_language", "emotion": "emo_target", "event": "event_target"}
# One tag anywhere in a text, its name captured: what SenseVoice emits and the JSONL carries.
TAG = re.compile(r"<\|([^|<>]*)\|>")


# Languages as corpora name them (lhotse, Common Voice, Hugging Face datasets): English names, ISO 639-1/2/3
# codes and the BCP-47 tags whose language subtag decides SenseVoice's. Cantonese is its own language in
# SenseVoice (yue), so the Chinese tags of Hong Kong and Macau (zh-HK, zh-MO), where it is spoken, map to
# it; any other zh-* (zh-CN, zh-TW, cmn-Hans-CN) is Mandarin.
LANGUAGE_NAMES = {
    "english": "en", "eng": "en", "chinese": "zh", "mandarin": "zh", "zho": "zh", "chi": "zh", "cmn": "zh",
    "putonghua": "zh", "cantonese": "yue", "yue": "yue", "japanese": "ja", "jpn": "ja", "korean": "ko",
    "kor": "ko", "zh-hk": "yue", "zh-mo": "yue",
}  # the SenseVoice codes themselves (en, zh, yue, ja, ko, nospeech) are matched first


def canonical_tag(kind: str, value: str) -> str | None:
    """Return ``<|name|>`` for a tag given as ``name`` or ``<|name|>`` in any case; None if unknown.
    A language may also be a name or an ISO/BCP-47 code (LANGUAGE_NAMES; en-US, zh_CN, yue-Hant-HK).

    >>> canonical_tag("emotion", "happy"), canonical_tag("language", "en-US")
    ('<|HAPPY|>', '<|en|>')
    """
    name = value.strip()
    if name.startswith("<|") and name.endswith("|>"):
        name = name[2:-2]
    by_lower = {n.lower(): n for n in KINDS[kind]}
    found = by_lower.get(name.lower())
    if found is None and kind == "language":
        parts = name.lower().replace("_", "-").split("-")
        region = parts[-1] if len(parts) > 1 and len(parts[-1]) == 2 else ""
        found = (LANGUAGE_NAMES.get(f"{parts[0]}-{region}") or LANGUAGE_NAMES.get(parts[0])
                 or by_lower.get(parts[0]))
    return None if found is None else f"<|{found}|>"


def valid_names(kind: str) -> str:
    """The valid values of a kind, for an error message."""
    extra = " (or a language name or ISO/BCP-47 code, e.g. English, en-US, zh-CN, Cantonese)"
    return f"valid {kind} tags: {', '.join(KINDS[kind])}" + (extra if kind == "language" else "")


def split_tags(text: str) -> tuple[dict[str, str], str]:
    """SenseVoice output ``<|en|><|NEUTRAL|><|Speech|><|woitn|>seven`` -> ({kind: name}, "seven").

    Every ``<|...|>`` anywhere in the text is removed from the transcript (whitespace collapsed); the
    known ones are filed by kind (the first of each kind wins), the unknown ones under "other".
    """
    tags: dict[str, str] = {}
    for name in TAG.findall(text):
        kind = next((k for k, names in KINDS.items() if name in names), "other")
        tags.setdefault(kind, name)
    return tags, " ".join(TAG.sub(" ", text).split())


def strip_tags(text: str) -> str:
    """The transcript without its tags: ``<|en|><|NEUTRAL|><|Speech|><|woitn|>one two`` -> ``one two``."""
    return split_tags(text)[1]


def bare_tag(value: str | None) -> str:
    """``<|en|>`` -> ``en``; None -> ``""``."""
    return "" if not value else value.strip().removeprefix("<|").removesuffix("|>")
