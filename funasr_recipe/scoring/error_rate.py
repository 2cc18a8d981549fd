"""Error rates of ASR hypotheses: text normalisation, tokenisation units, Levenshtein alignment.

No torch: shared by stage 3's scorer (scoring/score.py) and stage 4's export parity check
(runtime/parity.py). The edit distance is rapidfuzz's; the alignment that splits it into S/D/I is ours
(``align`` says why).

Normalisation (``normalize``), applied identically to references and hypotheses, in this order:
  1. SenseVoice tags ``<|...|>`` left in a text are replaced by a space.
  2. Unicode NFKC: full-width letters, digits and punctuation become half-width (``ＡＢＣ１２３`` ->
     ``ABC123``, ``，`` -> ``,``), ligatures and compatibility ideographs their plain forms.
  3. casefold (``Straße`` -> ``strasse``): lower() misses such cases.
  Steps 2 and 3 are data/textnorm.py's ``unicode_form`` and ``apply_case``, the primitives of the
  normaliser that stage 1 applies to training targets (docs/text_normalisation.md): training and
  scoring fold the same characters together, and scoring then folds case whatever the training policy.
  4. Every punctuation mark (Unicode category P*) and every symbol (category S*: ``~ + = $ ^ ` ©``,
     emoji) becomes a space, except an apostrophe between two letters or digits (``don't``,
     ``it's``, ``rock'n'roll``), which is part of the word. A leading or trailing apostrophe
     (``'cause``, ``students'``) is a quote mark and goes. Symbols go too because in transcripts they
     are decoration, not words: the ``~`` of a drawn-out Chinese syllable, the emoji that SenseVoice's
     rich post-processing puts in for its emotion and event tags, ``#`` or ``*`` of markup. A symbol
     read out as a word (``$5``) is only scored right when both sides write the same words anyway.
     Typographic apostrophes (U+2019, U+02BC) count as ``'``.
  5. Control characters become spaces, zero-width characters (U+200B-U+200D, U+2060, U+FEFF) are
     dropped; whitespace is collapsed and stripped.

Tokenisation units (``tokens``; the text is normalised first):
  char   every non-space character (CER): zh, yue, ja;
  word   whitespace-separated words (WER): en, ko (Korean eojeol are the words);
  mixed  each CJK character (Han with its extensions, Hiragana, Katakana) its own token, every other
         run split on whitespace, so English words in Chinese text stay words: for an unknown
         language, or a text that mixes scripts.
``unit_for(lang, ref)`` picks an utterance's unit from its language and its normalised reference only
(never the hypothesis), so every model decoded on a set is counted in the same units.

Empty references: an utterance without reference tokens still counts its insertions as errors; its own
``Counts.rate`` is 0 without errors and infinite with some; a corpus rate divides the summed errors by
the summed reference tokens (jiwer 4 instead divides by 1 when the whole corpus has no reference token).

  corpus_error_rate(["我爱 Python 编程"], ["我爱 python 编成"]) -> 0.2   (1 error / 5 tokens)
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from rapidfuzz.distance import Levenshtein

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.tags import TAG
from funasr_recipe.data.textnorm import FOLD, apply_case, unicode_form

UNITS = ("char", "word", "mixed")
CHAR_LANGUAGES = frozenset({"zh", "yue", "ja"})
WORD_LANGUAGES = frozenset({"en", "ko"})

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u02bc": "'"})
_DROPPED = frozenset("\u200b\u200c\u200d\u2060\ufeff")  # zero-width characters: not even a space

# CJK characters that are one token each in the "mixed" unit. NFKC has already mapped half-width
# Katakana, compatibility ideographs and Kangxi radicals to the blocks below.
_CJK_RANGES = (
    "\u2e80-\u2eff"  # CJK radicals supplement
    "\u3005\u3007\u3021-\u3029\u3038-\u303b"  # iteration marks, ideographic zero, Hangzhou numerals
    "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff"  # Hiragana, Katakana, Katakana phonetic extensions
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # Han: extension A, unified, compatibility
    "\U0001b000-\U0001b16f"  # Kana supplement and extended-A
    "\U00020000-\U0003ffff"  # Han extensions B-I and compatibility supplement (planes 2 and 3)
)
_CJK = re.compile(f"[{_CJK_RANGES}]")
_MIXED_TOKEN = re.compile(f"[{_CJK_RANGES}]|[^\\s{_CJK_RANGES}]+")


def normalize(text: str) -> str:
    """The normalised form of a reference or hypothesis (module docstring: the steps and why)."""
    text = apply_case(unicode_form(TAG.sub(" ", text), "NFKC"), FOLD).translate(_APOSTROPHES)
    out = []
    last = len(text) - 1
    for i, ch in enumerate(text):
        if ch in _DROPPED:
            continue
        cat = unicodedata.category(ch)
        if ch == "'" and 0 < i < last and text[i - 1].isalnum() and text[i + 1].isalnum():
            out.append(ch)
        elif cat[0] in "PS" or cat == "Cc":
            out.append(" ")
        else:
            out.append(ch)
    return " ".join("".join(out).split())


def chars(text: str) -> list[str]:
    """Every non-space character."""
    return [c for c in text if not c.isspace()]


def words(text: str) -> list[str]:
    """Whitespace-separated words."""
    return text.split()


def mixed(text: str) -> list[str]:
    """Each CJK character on its own, every other run split on whitespace.

    >>> mixed("我爱 python 编程")
    ['我', '爱', 'python', '编', '程']
    """
    return _MIXED_TOKEN.findall(text)


_TOKENIZERS = {"char": chars, "word": words, "mixed": mixed}


def tokens(text: str, unit: str) -> list[str]:
    """Tokens of an (already normalised) text in a unit: "char", "word" or "mixed"."""
    try:
        return _TOKENIZERS[unit](text)
    except KeyError:
        raise BadInputError(f"unknown unit {unit!r}; expected one of {UNITS}") from None


def unit_for_language(lang: str | None) -> str:
    """The error-rate unit of a language: "char" (zh, yue, ja), "word" (en, ko), else "mixed".

    Accepts a bare name or a SenseVoice tag in any case (``zh``, ``<|ZH|>``).
    """
    name = (lang or "").strip().removeprefix("<|").removesuffix("|>").lower()
    if name in CHAR_LANGUAGES:
        return "char"
    if name in WORD_LANGUAGES:
        return "word"
    return "mixed"


def mixes_scripts(text: str) -> bool:
    """True if a text holds both CJK characters and letters of another script (Latin, Hangul, ...)."""
    has_cjk = has_other = False
    for ch in text:
        if _CJK.match(ch):
            has_cjk = True
        elif ch.isalpha():
            has_other = True
        if has_cjk and has_other:
            return True
    return False


def unit_for(lang: str | None, ref: str) -> str:
    """The unit of one utterance: its language's, or "mixed" when the reference mixes scripts.

    Decided on the normalised reference alone, never the hypothesis, so every model decoded on a set
    is scored in the same units (same reference token counts) and a hallucinated English word does not
    change how a Chinese utterance is counted. Digits do not make a text mixed: ``2024年`` in Chinese
    stays five characters, as CER counts them.
    """
    unit = unit_for_language(lang)
    return "mixed" if unit != "mixed" and mixes_scripts(ref) else unit


def align(ref: Sequence[str], hyp: Sequence[str]) -> list[tuple[str, str | None, str | None]]:
    """Minimum-edit-distance alignment (unit costs) as (op, ref token, hyp token) in text order.

    op is "C" (correct), "S" (substitution), "D" (deletion: hyp token None) or "I" (insertion: ref token
    None). Ties: among the alignments with the fewest edits, one with the fewest substitutions, which
    is the one with the most correct tokens (edits = n_ref + n_hyp - 2 C - S), so "a b c" -> "x a c"
    aligns as I C D C, not S S C, as sclite (substitution 4, insertion and deletion 3) and jiwer do.
    Remaining ties go to the backtrace, which runs from the end and prefers the diagonal, then a
    deletion, then an insertion. A common prefix and suffix are matched as correct first (an optimal
    alignment always does). The error total never depends on ties, only the S/D/I split.

    Why not rapidfuzz's own alignment (``Levenshtein.opcodes``, which jiwer uses): it promises the fewest
    edits only, and takes no weights, so its S/D/I split of a tie is arbitrary ("a b c" -> "x a c" may
    come out S S C). rapidfuzz gives the distance that bounds the band of the DP below.
    """
    n, m = len(ref), len(hyp)
    head = 0
    while head < n and head < m and ref[head] == hyp[head]:
        head += 1
    tail = 0
    while tail < n - head and tail < m - head and ref[n - 1 - tail] == hyp[m - 1 - tail]:
        tail += 1
    r, h = ref[head:n - tail], hyp[head:m - tail]
    middle = _align_dp(r, h)
    return ([("C", t, t) for t in ref[:head]] + middle
            + [("C", t, t) for t in ref[n - tail:]])


def _align_dp(ref: Sequence[str], hyp: Sequence[str]) -> list[tuple[str, str | None, str | None]]:
    n, m = len(ref), len(hyp)
    if n == 0 or m == 0:
        return [("D", t, None) for t in ref] + [("I", None, t) for t in hyp]
    # A path through cell (i, j) costs at least |j - i| to get there and |(m - n) - (j - i)| to go on, so
    # with the distance d known first (rapidfuzz, cheap) the table needs only the diagonals where
    # that sum is <= d: every optimal path lies there, values on them are exact, and the backtrace
    # makes the full table's choices. O(d * n) cells instead of O(n * m).
    d, skew = distance(ref, hyp), m - n
    slack = (d - abs(skew)) // 2
    weight = n + m + 1  # cost = edits * weight + substitutions: fewest edits, then fewest substitutions
    table = _banded_table(ref, hyp, min(0, skew) - slack, max(0, skew) + slack, weight)
    ops: list[tuple[str, str | None, str | None]] = []
    i, j = n, m
    while i > 0 or j > 0:
        cost = table[i][j]
        if i > 0 and j > 0:
            same = ref[i - 1] == hyp[j - 1]
            if table[i - 1][j - 1] + (0 if same else weight + 1) == cost:
                ops.append(("C" if same else "S", ref[i - 1], hyp[j - 1]))
                i, j = i - 1, j - 1
                continue
        if i > 0 and table[i - 1][j] + weight == cost:
            ops.append(("D", ref[i - 1], None))
            i -= 1
        else:
            ops.append(("I", None, hyp[j - 1]))
            j -= 1
    ops.reverse()
    return ops


def distance(ref: Sequence[str], hyp: Sequence[str]) -> int:
    """Levenshtein distance of two token sequences (rapidfuzz: bit-parallel, in C++)."""
    return Levenshtein.distance(ref, hyp)


def _banded_table(ref: Sequence[str], hyp: Sequence[str], lo: int, hi: int, weight: int) -> list[list[int]]:
    """Cost table over the diagonals lo <= j - i <= hi (insertion and deletion cost ``weight``, a
    substitution one more); other cells hold a cost no path has."""
    n, m = len(ref), len(hyp)
    far = 2 * (n + m + 1) * weight
    sub = weight + 1
    prev = [j * weight if j <= hi else far for j in range(m + 1)]
    table = [prev]
    for i in range(1, n + 1):
        rt = ref[i - 1]
        cur = [far] * (m + 1)
        if i <= -lo:
            cur[0] = i * weight
        first = max(1, i + lo)
        left = cur[first - 1]
        for j in range(first, min(m, i + hi) + 1):
            best = prev[j - 1] if rt == hyp[j - 1] else prev[j - 1] + sub
            up = prev[j] + weight
            if up < best:
                best = up
            if left + weight < best:
                best = left + weight
            cur[j] = left = best
        table.append(cur)
        prev = cur
    return table


@dataclass
class Counts:
    """Error counts of one utterance or a sum of them (``+``)."""

    n_ref: int = 0
    sub: int = 0
    dele: int = 0
    ins: int = 0
    cor: int = 0

    @property
    def errors(self) -> int:
        return self.sub + self.dele + self.ins

    @property
    def n_hyp(self) -> int:
        return self.cor + self.sub + self.ins

    @property
    def rate(self) -> float:
        """errors / n_ref; with no reference token: 0.0 without errors, inf with insertions."""
        if self.n_ref == 0:
            return 0.0 if self.errors == 0 else math.inf
        return self.errors / self.n_ref

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.n_ref + other.n_ref, self.sub + other.sub, self.dele + other.dele,
                      self.ins + other.ins, self.cor + other.cor)

    def as_dict(self) -> dict[str, float | int | None]:
        """Figures for JSON: rate as a fraction (None where infinite), counts; "del" as in sclite."""
        rate = self.rate
        return {"rate": None if math.isinf(rate) else rate, "n_ref": self.n_ref, "sub": self.sub,
                "del": self.dele, "ins": self.ins, "cor": self.cor}


def count(alignment: Sequence[tuple[str, str | None, str | None]]) -> Counts:
    """Counts of an alignment from ``align``."""
    c = Counts()
    for op, _, _ in alignment:
        if op == "C":
            c.cor += 1
        elif op == "S":
            c.sub += 1
        elif op == "D":
            c.dele += 1
        else:
            c.ins += 1
    c.n_ref = c.cor + c.sub + c.dele
    return c


def utterance_counts(ref: str, hyp: str | None, unit: str) -> Counts:
    """Counts of one utterance in a unit; both texts are normalised here. None (a missing hypothesis)
    scores as an empty one: every reference token deleted."""
    return count(align(tokens(normalize(ref), unit), tokens(normalize(hyp or ""), unit)))


def corpus_counts(refs: Sequence[str], hyps: Sequence[str | None],
                  langs: Sequence[str | None] | None = None, unit: str | None = None) -> Counts:
    """Summed counts over utterances: each in ``unit`` if given, else in its language's unit
    (``unit_for``; "mixed" throughout when ``langs`` is None)."""
    if len(refs) != len(hyps) or (langs is not None and len(langs) != len(refs)):
        raise ValueError(f"{len(refs)} references, {len(hyps)} hypotheses"
                         + ("" if langs is None else f", {len(langs)} languages"))
    total = Counts()
    for i, (ref, hyp) in enumerate(zip(refs, hyps, strict=True)):
        ref_n = normalize(ref)
        u = unit or unit_for(None if langs is None else langs[i], ref_n)
        total = total + count(align(tokens(ref_n, u), tokens(normalize(hyp or ""), u)))
    return total


def corpus_error_rate(refs: list[str], hyps: list[str], langs: list[str | None] | None = None) -> float:
    """Summed errors / summed reference tokens after ``normalize``, each utterance in its language's
    unit ("mixed" for all when ``langs`` is None). inf if there are errors but no reference token."""
    return corpus_counts(refs, hyps, langs).rate
