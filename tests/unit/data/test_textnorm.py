"""data/textnorm.py, the one normaliser (issue #30 item 7): spellings of one word that used to become
different token ids (NFD and NFC, full-width and ASCII, ``Four`` and ``FOUR``) are one token sequence
with a from-scratch tokenizer trained on the normalised text; the policy, its config key and defaults;
the vocabulary's case convention for a fine-tune; scoring's figures unchanged through the shared
primitives.

Trains small sentencepiece models under pytest's tmp paths (no audio, no model).
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
import sentencepiece as spm
from funasr.tokenizer.sentencepiece_tokenizer import SentencepiecesTokenizer

import funasr_recipe.model.sensevoice_tokenizer as sensevoice_tokenizer
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data import textnorm
from funasr_recipe.data.textnorm import FINE_TUNE, FROM_SCRATCH, TextNorm, from_config, vocab_case
from funasr_recipe.model.tokenizer import build_tokenizer
from funasr_recipe.scoring import error_rate
from funasr_recipe.scoring.error_rate import corpus_counts, normalize, utterance_counts

DIGITS = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()
CAFE_NFC = "CAF\u00c9"  # É, one code point
CAFE_NFD = unicodedata.normalize("NFD", CAFE_NFC)  # E + combining acute
# One utterance each, spelled as transcripts arrive: the keys are the forms' names.
SPELLINGS = {"nfc": f"{CAFE_NFC} FOUR", "nfd": f"{CAFE_NFD} FOUR", "full_width": f"{CAFE_NFC} ＦＯＵＲ",
             "title": f"{CAFE_NFC.title()} Four", "lower": f"{CAFE_NFC.lower()} four",
             "nbsp": f"{CAFE_NFC}\u00a0\u00a0FOUR"}


def write_jsonl(path: Path, targets: list[str]) -> Path:
    path.write_text("".join(json.dumps({"key": f"u{i}", "target": t, "text_language": "<|en|>"},
                                       ensure_ascii=False) + "\n" for i, t in enumerate(targets)),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits many times, then every spelling of the test words once (as a real corpus mixes them)."""
    targets = [" ".join(DIGITS[i:] + DIGITS[:i]) for i in range(10)] * 3 + list(SPELLINGS.values())
    return write_jsonl(tmp_path_factory.mktemp("data") / "data.jsonl", targets)


@pytest.mark.parametrize("kind,sp_type", [("word", "bpe"), ("bpe", "bpe"), ("sensevoice", "word")])
def test_every_spelling_is_one_token_sequence_after_normalisation(kind: str, sp_type: str, corpus: Path,
                                                                 tmp_path: Path) -> None:
    model = build_tokenizer(corpus, tmp_path, kind, 40, sp_type)  # the from-scratch default policy
    cls = sensevoice_tokenizer.SenseVoiceTagTokenizer if kind == "sensevoice" else SentencepiecesTokenizer
    tok = cls(bpemodel=str(model))
    sp = spm.SentencePieceProcessor(model_file=str(model))
    ids = {name: tok.encode(FROM_SCRATCH(text, "<|en|>")) for name, text in SPELLINGS.items()}
    assert all(sp.unk_id() not in seq for seq in ids.values()), ids
    assert len({tuple(seq) for seq in ids.values()}) == 1, ids
    assert tok.decode(ids["nfd"]) == f"{CAFE_NFC} FOUR"
    pieces = set(json.loads((tmp_path / "tokens.json").read_text(encoding="utf-8")))
    if kind != "bpe":  # a word vocabulary: one piece per word, not one per spelling
        assert "▁FOUR" in pieces and not {"▁Four", "▁four", "▁ＦＯＵＲ"} & pieces
    info = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert info["transcript_norm"] == {"form": "NFKC", "case": "upper", "languages": {}}


def test_a_lower_policy_trains_a_lower_case_vocabulary(corpus: Path, tmp_path: Path) -> None:
    norm = from_config({"transcript_norm": {"case": "lower"}})
    model = build_tokenizer(corpus, tmp_path, "word", 40, text_norm=norm)
    tok = SentencepiecesTokenizer(bpemodel=str(model))
    assert len({tuple(tok.encode(norm(t))) for t in SPELLINGS.values()}) == 1
    assert vocab_case(json.loads((tmp_path / "tokens.json").read_text(encoding="utf-8"))) == "lower"


def test_the_normaliser_steps() -> None:
    assert FROM_SCRATCH("  ｆｏｕｒ\u3000ＦＩＶＥ\tsix ") == "FOUR FIVE SIX"
    assert FROM_SCRATCH("ﬁve ①") == "FIVE 1"  # ligature and compatibility digit
    assert TextNorm("NFC", "keep")("ＦＯＵＲ Four") == "ＦＯＵＲ Four"  # NFC keeps width
    assert TextNorm("NFC", "keep")(CAFE_NFD) == CAFE_NFC
    assert TextNorm("none", "keep")(CAFE_NFD) == CAFE_NFD
    assert TextNorm("NFKC", "lower")("Straße") == "straße"  # lower, not casefold: the word stays
    greek = FROM_SCRATCH("ΐ")  # upper() leaves it outside NFC: the form is applied again
    assert greek == unicodedata.normalize("NFKC", greek) == FROM_SCRATCH(greek)
    assert FROM_SCRATCH("我爱 Python") == "我爱 PYTHON"


def test_policy_from_the_config() -> None:
    assert from_config({}) == FROM_SCRATCH == TextNorm("NFKC", "upper")
    assert from_config({"pretrained_model": "iic/x"}) == FINE_TUNE
    norm = from_config({"transcript_norm": {"form": "nfc", "case": "Lower", "languages": {"<|zh|>": "keep"}}})
    assert norm == TextNorm("NFC", "lower", (("zh", "keep"),))
    assert norm("Four", "<|en|>") == "four" and norm("Four", "zh") == "Four" and norm("Four") == "four"
    for bad, why in [({"case": "title"}, "case"), ({"form": "NFD"}, "form"), ({"casing": "lower"}, "unknown"),
                     ({"languages": {"en": "x"}}, "languages.en"), ("lower", "section"),
                     ({"case": "vocab"}, "fine-tuning")]:
        with pytest.raises(BadInputError, match=why):
            from_config({"transcript_norm": bad})


def test_a_fine_tune_keeps_the_case_convention_of_its_vocabulary(corpus: Path, tmp_path: Path) -> None:
    # The SenseVoice-format tokenizer the recipe builds (as tests/helpers/model_dirs.py's model dirs
    # have it): upper-case words, lower-case tags (<|en|>) and <unused_N> fillers, which do not count.
    model = build_tokenizer(corpus, tmp_path, "sensevoice", 40, "word")
    tok = sensevoice_tokenizer.SenseVoiceTagTokenizer(bpemodel=str(model))
    pieces = [tok.sp.IdToPiece(i) for i in range(tok.sp.GetPieceSize())]
    assert vocab_case(pieces) == "upper"
    norm = FINE_TUNE.resolved(pieces)
    assert norm.case == "upper" and tok.encode(norm("four", "<|en|>")) == tok.encode("FOUR")
    assert vocab_case(["<unk>", "▁the", "▁cat", "s"]) == "lower"
    assert vocab_case(["▁The", "▁cat", "▁NASA", "▁a"]) == "keep"  # both: ITN-style text
    assert vocab_case(["<unk>", "我", "爱"]) == "keep"  # no cased letter
    assert FINE_TUNE.resolved(None).case == "keep"
    with pytest.raises(BadInputError, match="vocab"):
        FINE_TUNE("Four")


# Scoring: its figures on a known pair, pinned from the code before the normaliser was shared, and
# its normalisation going through textnorm's primitives.
REFS = ["<|en|>Four café, ＦＩＶＥ Straße don't", "我爱 Python 编程。", "NINE ZERO"]
HYPS = [unicodedata.normalize("NFD", "four cafe\u0301 five strasse dont"), "我爱 python 编成", "nine"]


def test_scoring_of_a_known_pair_is_unchanged() -> None:
    assert [normalize(r) for r in REFS] == ["four café five strasse don't", "我爱 python 编程", "nine zero"]
    assert normalize(HYPS[0]) == "four café five strasse dont"
    assert corpus_counts(REFS, HYPS, ["en", "zh", "en"]).as_dict() == {
        "rate": 0.25, "n_ref": 12, "sub": 2, "del": 1, "ins": 0, "cor": 9}
    assert corpus_counts(REFS, HYPS, None, "char").as_dict() == {
        "rate": pytest.approx(6 / 42), "n_ref": 42, "sub": 1, "del": 5, "ins": 0, "cor": 36}
    assert [utterance_counts(r, h, "word").errors for r, h in zip(REFS, HYPS, strict=True)] == [1, 1, 1]


def test_scoring_folds_through_the_shared_primitives(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []

    def spy(text: str, case: str) -> str:
        calls.append((text, case))
        return textnorm.apply_case(text, case)

    monkeypatch.setattr(error_rate, "apply_case", spy)
    assert normalize("ＦＯＵＲ Five") == "four five"
    assert calls == [("FOUR Five", textnorm.FOLD)]
    for text in ["Straße", CAFE_NFD, "ＡＢＣ１２３，", "İstanbul", "ﬁ"]:  # NFKC then casefold, as before
        assert textnorm.apply_case(textnorm.unicode_form(text, "NFKC"), textnorm.FOLD) == \
            unicodedata.normalize("NFKC", text).casefold()
