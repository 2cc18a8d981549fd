"""The one text normaliser of the recipe: Unicode form, letter case, whitespace (docs/text_normalisation.md).

Reads  a model config's ``transcript_norm`` section (``from_config``) and, for the ``vocab`` case policy,
       the pieces of a pretrained tokenizer's vocabulary (``TextNorm.resolved``); writes nothing.

Who calls it: stage 1 normalises the text a from-scratch tokenizer is trained on (model/tokenizer.py) and
the ``target`` of every utterance it dumps, which training tokenises (features/targets.py, given the
normaliser by local/compute_fbank.py); scoring (scoring/error_rate.py) uses the same two primitives,
``unicode_form`` and ``apply_case``, in its own fixed setting (NFKC, then ``fold``).

A ``TextNorm`` applied to a transcript, in this order:
  1. the Unicode form: ``NFKC`` (default; NFD and NFC spellings of a word become one, full-width
     letters, digits and punctuation become ASCII: ``ＦＯＵＲ`` -> ``FOUR``, ``，`` -> ``,``, ligatures
     and other compatibility characters their plain forms), ``NFC`` (canonical composition only:
     full-width forms are kept) or ``none``;
  2. the case of the utterance's language: ``keep``, ``lower`` or ``upper`` (``Four`` and ``FOUR``
     become one word), then the form again: a case mapping can leave text outside its normal form
     (``ΐ``.upper() is three code points);
  3. whitespace: every run of Unicode whitespace (which NFKC can produce, ``¨`` -> `` ̈``) becomes one
     space, none at either end, as stage 0's manifest already does (data/manifest.py).

Case policy. ``case`` is every language's default, ``languages`` overrides it per language (the bare
SenseVoice code of the utterance's ``text_language``: ``{zh: keep}``). Defaults:
  from scratch (no ``pretrained_model``): NFKC, ``upper``: the tokenizer is trained on the normalised
      text, so one spelling per word; upper because the recipe's English corpora are written so
      (Kaldi's convention: FSDD, LibriSpeech, speechocean762), which leaves their text, vocabulary
      and results as they were. Scoring folds case, so the direction does not move an error rate.
  fine-tuning: NFKC, ``vocab``: the case convention the pretrained tokenizer's vocabulary has
      (``vocab_case``): ``upper`` or ``lower`` when at least 99% of its cased letters are of that
      case, else ``keep`` (a vocabulary with both, such as one trained on text with ITN).

  norm = from_config({"pretrained_model": None, "transcript_norm": {"case": "lower"}})
  norm("Ｆｏｕｒ  Five", "<|en|>") == "four five"
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.tags import TAG, bare_tag

CONFIG_KEY = "transcript_norm"  # not "text_norm": funasr's SenseVoice inference reads that kwarg
FORMS = ("NFKC", "NFC", "none")
CASES = ("keep", "lower", "upper")
VOCAB = "vocab"  # resolved to one of CASES from a pretrained tokenizer's pieces
FOLD = "fold"  # str.casefold: scoring's caseless comparison form, not a training policy
VOCAB_CASE_SHARE = 0.99  # share of a vocabulary's cased letters that makes its convention one case
_KEYS = ("form", "case", "languages")


def unicode_form(text: str, form: str) -> str:
    """``text`` in a Unicode normal form: "NFKC", "NFC" or "none" (unchanged)."""
    if form == "none":
        return text
    if form not in FORMS:
        raise BadInputError(f"unknown Unicode form {form!r}; choose one of {', '.join(FORMS)}")
    return unicodedata.normalize(form, text)


def apply_case(text: str, case: str) -> str:
    """``text`` with a case policy applied: "keep", "lower", "upper" or "fold" (casefold, which also
    maps ``ß`` to ``ss``: right for comparing, wrong for a transcript to learn)."""
    if case == "keep":
        return text
    if case == "lower":
        return text.lower()
    if case == "upper":
        return text.upper()
    if case == FOLD:
        return text.casefold()
    raise BadInputError(f"unknown case policy {case!r}; choose one of {', '.join(CASES)}")


def collapse_whitespace(text: str) -> str:
    """Every run of Unicode whitespace one space, none at the ends."""
    return " ".join(text.split())


def language_code(language: str | None) -> str:
    """``<|en|>``, ``EN`` or ``en`` -> ``en``; None -> ``""``."""
    return bare_tag(language).strip().lower()


@dataclass(frozen=True)
class TextNorm:
    """A normalisation policy (module docstring); call it on a transcript and its language."""

    form: str = "NFKC"
    case: str = "upper"
    languages: tuple[tuple[str, str], ...] = ()  # (language code, case) overrides, sorted

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise BadInputError(f"{CONFIG_KEY}.form: {self.form!r} is not one of {', '.join(FORMS)}")
        for where, case in (("case", self.case), *((f"languages.{k}", v) for k, v in self.languages)):
            if case not in (*CASES, VOCAB):
                raise BadInputError(f"{CONFIG_KEY}.{where}: {case!r} is not one of "
                                    f"{', '.join((*CASES, VOCAB))}")

    def case_for(self, language: str | None) -> str:
        """The case policy of an utterance in ``language`` (a code or a SenseVoice tag; None: default)."""
        return dict(self.languages).get(language_code(language), self.case)

    def __call__(self, text: str, language: str | None = None) -> str:
        text = unicode_form(text, self.form)
        case = self.case_for(language)
        if case == VOCAB:
            raise BadInputError(f"{CONFIG_KEY}: case 'vocab' needs the pretrained tokenizer's vocabulary "
                                "(TextNorm.resolved) before it can normalise")
        cased = apply_case(text, case)
        if cased != text:
            text = unicode_form(cased, self.form)
        return collapse_whitespace(text)

    @property
    def needs_vocab(self) -> bool:
        """True while a policy is ``vocab``: ``resolved`` must replace it first."""
        return VOCAB in (self.case, *(c for _, c in self.languages))

    def resolved(self, pieces: Iterable[str] | None) -> TextNorm:
        """This policy with ``vocab`` replaced by ``vocab_case(pieces)`` (``keep`` without pieces)."""
        if not self.needs_vocab:
            return self
        case = "keep" if pieces is None else vocab_case(pieces)
        return TextNorm(self.form, case if self.case == VOCAB else self.case,
                        tuple((k, case if v == VOCAB else v) for k, v in self.languages))

    def describe(self) -> dict[str, Any]:
        """The policy as a config section (for logs and tokenizer.json)."""
        return {"form": self.form, "case": self.case, "languages": dict(self.languages)}


FROM_SCRATCH = TextNorm("NFKC", "upper")
FINE_TUNE = TextNorm("NFKC", VOCAB)


def vocab_case(pieces: Iterable[str]) -> str:
    """The case convention of a vocabulary: "upper" or "lower" when at least VOCAB_CASE_SHARE of the
    cased letters of its pieces are so, else "keep" (both cases, or a caseless script only). Special
    pieces (``<unk>``, ``<|en|>``, ``<unused_7>``) are not counted: they are no text."""
    upper = lower = 0
    for piece in pieces:
        if (piece.startswith("<") and piece.endswith(">")) or TAG.fullmatch(piece):
            continue
        upper += sum(ch.isupper() for ch in piece)
        lower += sum(ch.islower() for ch in piece)
    cased = upper + lower
    if cased == 0:
        return "keep"
    if upper >= VOCAB_CASE_SHARE * cased:
        return "upper"
    if lower >= VOCAB_CASE_SHARE * cased:
        return "lower"
    return "keep"


def from_config(cfg: Mapping[str, Any] | None) -> TextNorm:
    """The policy of a recipe model config (conf/*.yaml, a DictConfig or dict): its ``transcript_norm``
    section over the default for a from-scratch model or a fine-tune (``pretrained_model`` set)."""
    cfg = cfg or {}
    pretrained = bool(cfg.get("pretrained_model"))
    base = FINE_TUNE if pretrained else FROM_SCRATCH
    section = cfg.get(CONFIG_KEY)
    if section is None:
        return base
    if not isinstance(section, Mapping):
        raise BadInputError(f"{CONFIG_KEY}: a section {{form, case, languages}}, not {section!r}")
    unknown = sorted(set(section) - set(_KEYS))
    if unknown:
        raise BadInputError(f"{CONFIG_KEY}: unknown keys {unknown}; it takes {', '.join(_KEYS)}")
    languages = section.get("languages") or {}
    if not isinstance(languages, Mapping):
        raise BadInputError(f"{CONFIG_KEY}.languages: a mapping of language code to case, not {languages!r}")
    form = str(section.get("form", base.form))
    case = str(section.get("case", base.case))
    norm = TextNorm("none" if form.lower() == "none" else form.upper(), case.lower(),
                    tuple(sorted((language_code(str(k)), str(v).lower()) for k, v in languages.items())))
    if not pretrained and norm.needs_vocab:
        raise BadInputError(f"{CONFIG_KEY}: case 'vocab' is for fine-tuning; a from-scratch tokenizer is "
                            "trained on the normalised text and has no convention of its own")
    return norm
