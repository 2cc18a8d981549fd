"""Text from a character token list (the hub's Chinese Paraformer: tokens.json, no sentencepiece model),
joined as funasr does it (``sentence_postprocess`` of funasr and funasr-onnx), for the runtime alone.

Why not call funasr-onnx's: importing it imports its package, which loads librosa, numba and
scikit-learn, hundreds of MB that a CPU service would install for this one function.
tests/unit/runtime/test_char_tokens.py checks this against funasr-onnx's on generated token lists.
The one difference: where funasr raises ValueError (a token neither CJK nor letters, e.g. "," in mixed
text), this keeps the token as written, since a server must not fail a request on its own vocabulary.
Reads and writes nothing.

  join_char_tokens(["<s>", "你", "好", "hel@@", "lo", "a", "b"])   # "你好hello AB"
"""

from __future__ import annotations

MARKERS = frozenset({"<s>", "</s>", "<unk>"})


def _cjk_or_digit(text: str) -> bool:
    # funasr compares whole strings, not characters: "12" counts, "9a" does not.
    return "\u4e00" <= text <= "\u9fff" or "0" <= text <= "9"


def _stripped(token: str) -> str:
    return token.replace(" ", "").replace("</s>", "").replace("<s>", "")


def _all_cjk(parts: list[str] | str) -> bool:
    cleaned = [_stripped(p) for p in parts]
    return bool(cleaned) and all(_cjk_or_digit(p) for p in cleaned)


def _all_letters(parts: list[str] | str) -> bool:
    cleaned = [_stripped(p) for p in parts]
    return bool(cleaned) and all((p.isalpha() or p == "'") and not (p.isalpha() and _cjk_or_digit(p))
                                 for p in cleaned)


def _single_letter(word: str) -> bool:
    return len(word) == 1 and word.isascii() and word.isalpha()


def _abbreviations(words: list[str]) -> list[str]:
    """Runs of single letters, each followed by a space (``a b c``), become one upper-case word (ABC)."""
    out, i = [], 0
    while i < len(words):
        j = i
        while j + 2 < len(words) and _single_letter(words[j]) and words[j + 1] == " " \
                and _single_letter(words[j + 2]):
            j += 2
        if j > i:
            out.append("".join(words[i:j + 1:2]).upper())
            i = j + 1
        else:
            out.append(words[i])
            i += 1
    return out


def _words(tokens: list[str]) -> list[str]:
    """funasr's word list: CJK tokens as they are, BPE pieces (``xx@@``) glued to the next token, each
    letter word followed by a space (removed again before a CJK token in mixed text)."""
    if _all_cjk(tokens):
        return [t.replace(" ", "") for t in tokens]
    words: list[str] = []
    pending = ""
    letters = _all_letters(tokens)
    space_last = False
    for token in tokens:
        if not letters and _all_cjk(token):
            if space_last:
                words.pop()
            words.append(token)
            space_last = False
        elif "@@" in token:
            pending += token.replace("@@", "")
            space_last = False
        elif letters or _all_letters(token):
            words += [pending + token, " "]
            pending, space_last = "", True
        else:  # funasr raises ValueError here
            words.append(pending + token)
            pending, space_last = "", False
    return words


def join_char_tokens(tokens: list[str]) -> str:
    """The transcript of a Paraformer's character tokens, as funasr writes it."""
    kept = [t for t in tokens if t not in MARKERS]
    return "".join(_abbreviations(_words(kept))).strip()
