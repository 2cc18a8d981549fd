"""The fixed facts of SenseVoiceSmall's vocabulary: its size, the id of every tag of data/tags.py, and the
name of the funasr tokenizer class that encodes it. Shared by the tokenizer builder (model/tokenizer.py)
and that class (model/sensevoice_tokenizer.py), so that neither imports the other for them. Reads and
writes nothing.

  SENSEVOICE_TAG_IDS["<|en|>"] == 24885
"""

from __future__ import annotations

from funasr_recipe.data.tags import EMOTIONS, EVENTS, ITN, LANGUAGES
from funasr_recipe.families.registry import SENSEVOICE

SENSEVOICE_VOCAB_SIZE = int(SENSEVOICE.released_vocab_size or 0)  # the class hard-codes ids up to it
# The funasr tokenizer class (its registered name) that encodes the sensevoice kind:
# model/sensevoice_tokenizer.py.
SENSEVOICE_TOKENIZER = "SenseVoiceTagTokenizer"
FIRST_TAG_ID = 24884  # learned pieces must all sit below the first tag


def _prompt_tags(names: dict[str, int], tokens: dict[int, int]) -> dict[str, int]:
    """``<|name|>`` -> token id, from the family's prompt ids (name -> id) and token ids (token -> id)."""
    by_id = {i: name for name, i in names.items()}
    return {f"<|{by_id[i]}|>": token for token, i in tokens.items()}


# Ids that funasr 1.4.16 SenseVoiceSmall (and funasr-onnx's copy of it) hard-code: lid_int_dict,
# emo_dict and textnorm_int_dict in funasr/models/sense_voice/model.py (the registry holds the first
# and the last). Only these are guaranteed to equal the released tokenizer's ids.
_MODEL_HARD_CODED = {
    **_prompt_tags(dict(SENSEVOICE.language_ids), dict(SENSEVOICE.language_token_ids)),
    "<|HAPPY|>": 25001, "<|SAD|>": 25002, "<|ANGRY|>": 25003, "<|NEUTRAL|>": 25004,
    "<|EMO_UNKNOWN|>": 25009,
    **_prompt_tags(dict(SENSEVOICE.textnorm_ids), dict(SENSEVOICE.textnorm_token_ids)),
}
# The other tags are not hard-coded by the model; these free ids in the tag range are our choice and
# need not match the release (a model trained with this tokenizer only has to agree with itself).
_OUR_CHOICE = {
    "<|FEARFUL|>": 25005, "<|DISGUSTED|>": 25006, "<|SURPRISED|>": 25007,
    "<|Speech|>": 24993, "<|BGM|>": 24994, "<|Applause|>": 24995, "<|Laughter|>": 24996,
    "<|Cry|>": 24997, "<|Sneeze|>": 24998, "<|Breath|>": 24999, "<|Cough|>": 25000,
    "<|Sing|>": 25010, "<|Speech_Noise|>": 25011, "<|Event_UNK|>": 25012,
}


def _tag_table() -> dict[str, int]:
    table = {**_MODEL_HARD_CODED, **_OUR_CHOICE}
    wanted = {f"<|{name}|>" for name in (*LANGUAGES, *EMOTIONS, *EVENTS, *ITN)}
    # Fail at import rather than at training time if data/tags.py gains a tag.
    if set(table) != wanted:
        raise RuntimeError(f"SenseVoice tag ids out of step with funasr_recipe/data/tags.py: "
                           f"no id for {sorted(wanted - set(table))}, unknown {sorted(set(table) - wanted)}")
    ids = list(table.values())
    if len(set(ids)) != len(ids) or not all(FIRST_TAG_ID <= i < SENSEVOICE_VOCAB_SIZE for i in ids):
        raise RuntimeError("SenseVoice tag ids must be distinct and inside the tag range")
    return dict(sorted(table.items(), key=lambda kv: kv[1]))


SENSEVOICE_TAG_IDS: dict[str, int] = _tag_table()
