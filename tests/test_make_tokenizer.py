"""model/tokenizer.py (stage 1 builds a from-scratch model's tokenizer with it): tag ids, round trips,
special ids, and the unmodified SenseVoiceSmall.

Encoding goes through funasr's SentencepiecesTokenizer, the class the trainer uses.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from funasr.tokenizer.sentencepiece_tokenizer import SentencepiecesTokenizer

from funasr_recipe.data.tags import EMOTIONS, EVENTS, ITN, LANGUAGES
from funasr_recipe.model.tokenizer import (
    KINDS,
    SENSEVOICE_TAG_IDS,
    SENSEVOICE_VOCAB_SIZE,
    build_tokenizer,
    check_tags,
    model_file_name,
)

DIGITS = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()


def _transcripts() -> list[str]:
    # The digit corpus's targets (single words) plus multi-word lines, as a fresh clone has no data/.
    rng = random.Random(0)
    multi = [" ".join(rng.choices(DIGITS, k=rng.randint(2, 6))) for _ in range(60)]
    return [w for w in DIGITS for _ in range(5)] + ["ONE TWO THREE", "NINE EIGHT SEVEN SIX"] + multi


def _write_jsonl(path: Path, targets: list[str]) -> Path:
    lines = [json.dumps({"key": f"utt{i}", "source": f"/x/{i}.wav", "target": t, "text_language": "<|en|>"})
             for i, t in enumerate(targets)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_jsonl(tmp_path_factory.mktemp("data") / "data.jsonl", _transcripts())


@pytest.fixture(scope="module")
def built(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tok")
    return {kind: build_tokenizer(corpus, root / kind, kind, 60) for kind in KINDS}


def test_tag_table_covers_every_tag_once() -> None:
    tags = {f"<|{n}|>" for n in (*LANGUAGES, *EMOTIONS, *EVENTS, *ITN)}
    assert set(SENSEVOICE_TAG_IDS) == tags
    assert len(set(SENSEVOICE_TAG_IDS.values())) == len(tags)
    assert all(24884 <= i < SENSEVOICE_VOCAB_SIZE for i in SENSEVOICE_TAG_IDS.values())


def test_sensevoice_tags_are_one_token_at_their_ids(built: dict[str, Path]) -> None:
    model = built["sensevoice"]
    assert model.name == "chn_jpn_yue_eng_ko_spectok.bpe.model" == model_file_name("sensevoice")
    tok = SentencepiecesTokenizer(bpemodel=model)
    assert tok.get_vocab_size() == SENSEVOICE_VOCAB_SIZE == 25055
    for tag, want in SENSEVOICE_TAG_IDS.items():
        assert tok.encode(tag, allowed_special="all") == [want], tag
        assert tok.decode([want]) == tag
    check_tags(model)
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2)  # the release's layout; blank is 0
    info = json.loads((model.parent / "tokenizer.json").read_text())
    assert info["vocab_size"] == 25055 and info["learned_pieces"] < 24884


def test_check_tags_names_the_bad_tag(built: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="25055"):
        check_tags(built["bpe"])
    # Same size, one tag moved: check_tags must name it.
    from sentencepiece import sentencepiece_model_pb2 as sp_pb2

    proto = sp_pb2.ModelProto()
    proto.ParseFromString(built["sensevoice"].read_bytes())
    a, b = proto.pieces[24885], proto.pieces[24886]  # <|en|> and the filler after it
    a.piece, b.piece = b.piece, a.piece
    a.type, b.type = b.type, a.type
    bad = tmp_path / "bad.model"
    bad.write_bytes(proto.SerializeToString())
    with pytest.raises(ValueError, match=r"<\|en\|>"):
        check_tags(bad)


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_every_transcript(kind: str, built: dict[str, Path]) -> None:
    tok = SentencepiecesTokenizer(bpemodel=built[kind])
    sp = spm.SentencePieceProcessor(model_file=str(built[kind]))
    for text in _transcripts():
        ids = tok.encode(text, allowed_special="all")
        assert sp.unk_id() not in ids, (kind, text)
        assert tok.decode(ids) == text, (kind, text)
    if kind == "word":
        assert tok.text2tokens("ONE TWO") == ["▁ONE", "▁TWO"]  # one token per digit word


@pytest.mark.parametrize("kind", ["bpe", "unigram", "char", "word"])
def test_plain_kinds_special_ids_and_tokens_json(kind: str, built: dict[str, Path]) -> None:
    model = built[kind]
    assert model.name == "tokenizer.model"
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert [sp.id_to_piece(i) for i in range(4)] == ["<blank>", "<s>", "</s>", "<unk>"]
    assert (sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id()) == (0, 1, 2, 3)
    tokens = json.loads((model.parent / "tokens.json").read_text(encoding="utf-8"))
    assert tokens == [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    info = json.loads((model.parent / "tokenizer.json").read_text())
    assert info["kind"] == kind and info["vocab_size"] == len(tokens)
    assert info["num_transcripts"] == len(_transcripts()) and info["model_file"] == "tokenizer.model"


def test_small_corpus_gives_fewer_pieces_than_asked(corpus: Path, tmp_path: Path) -> None:
    build_tokenizer(corpus, tmp_path, "bpe", 5000)
    info = json.loads((tmp_path / "tokenizer.json").read_text())
    assert info["requested_vocab_size"] == 5000 and 4 < info["learned_pieces"] == info["vocab_size"] < 5000


def test_char_keeps_every_character_and_word_reports_unknowns(corpus: Path, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    # A vocabulary below the character count must not turn rare characters into <unk>.
    tok = SentencepiecesTokenizer(bpemodel=build_tokenizer(corpus, tmp_path / "char", "char", 5))
    assert all(tok.decode(tok.encode(t)) == t for t in _transcripts())
    # A word vocabulary smaller than the corpus's words is allowed, but counted in the log.
    with caplog.at_level("WARNING", logger="funasr_recipe.model.tokenizer"):
        build_tokenizer(corpus, tmp_path / "word", "word", 8)
    assert "transcripts do not survive encode/decode" in caplog.text


def test_sensevoice_small_accepts_the_targets(built: dict[str, Path]) -> None:
    from funasr.models.sense_voice.model import SenseVoiceSmall

    torch.manual_seed(0)
    encoder_conf = {"output_size": 64, "attention_heads": 2, "linear_units": 128, "num_blocks": 2,
                    "tp_blocks": 1, "kernel_size": 11, "sanm_shfit": 0, "dropout_rate": 0.0}
    model = SenseVoiceSmall(encoder="SenseVoiceEncoderSmall", encoder_conf=encoder_conf, input_size=560,
                            vocab_size=SENSEVOICE_VOCAB_SIZE)
    # Our table agrees with the ids the model hard-codes.
    assert set(model.lid_int_dict) == {SENSEVOICE_TAG_IDS[f"<|{n}|>"] for n in LANGUAGES}
    assert set(model.textnorm_int_dict) == {SENSEVOICE_TAG_IDS[f"<|{n}|>"] for n in ITN}
    assert model.emo_dict["unk"] == SENSEVOICE_TAG_IDS["<|EMO_UNKNOWN|>"]
    assert all(model.emo_dict[e.lower()] == SENSEVOICE_TAG_IDS[f"<|{e}|>"]
               for e in ("HAPPY", "SAD", "ANGRY", "NEUTRAL"))

    # Token ids exactly as SenseVoiceCTCDataset.__getitem__ and its collator build them.
    tok = SentencepiecesTokenizer(bpemodel=built["sensevoice"])
    items = [("<|en|>", "<|NEUTRAL|>", "<|Speech|>", "<|woitn|>", "ONE TWO THREE"),
             ("<|zh|>", "<|EMO_UNKNOWN|>", "<|Event_UNK|>", "<|withitn|>", "SEVEN")]
    texts = [torch.tensor([i for part in item for i in tok.encode(part, allowed_special="all")])
             for item in items]
    for t, item in zip(texts, items, strict=True):
        assert t[:4].tolist() == [SENSEVOICE_TAG_IDS[tag] for tag in item[:4]]
        assert int(t[0]) in model.lid_int_dict and int(t[3]) in model.textnorm_int_dict
    text = torch.nn.utils.rnn.pad_sequence(texts, batch_first=True, padding_value=-1)
    text_lengths = torch.tensor([[len(t)] for t in texts], dtype=torch.int32)
    speech = torch.randn(2, 30, 560)
    speech_lengths = torch.tensor([[30], [24]], dtype=torch.int32)

    loss, stats, _ = model(speech, speech_lengths, text, text_lengths)
    assert torch.isfinite(loss), stats
    assert torch.isfinite(stats["loss_ctc"]) and torch.isfinite(stats["loss_rich"])
    loss.backward()  # gradients reach the output layer for every id, tags included


@pytest.mark.parametrize(("line", "why"), [('{"key": "u", "target": "  "}', "empty transcript"),
                                           ("not json", "not a JSON object"),
                                           ('{"key": "u"}', "no string 'target'")])
def test_bad_line_is_named_by_file_and_line(line: str, why: str, tmp_path: Path) -> None:
    jsonl = _write_jsonl(tmp_path / "data.jsonl", ["ONE", "TWO"])
    with open(jsonl, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    with pytest.raises(ValueError, match=rf"data\.jsonl:3: {why}"):
        build_tokenizer(jsonl, tmp_path / "out", "bpe", 30)
    assert not (tmp_path / "out").exists()


def test_sensevoice_tags_over_a_unigram_model(corpus: Path, tmp_path: Path) -> None:
    model = build_tokenizer(corpus, tmp_path / "sv", "sensevoice", 80, sp_type="unigram")
    info = json.loads((tmp_path / "sv" / "tokenizer.json").read_text())
    assert info["sp_type"] == "unigram" and model.name == info["model_file"] == model_file_name("sensevoice")
    check_tags(model)
    with pytest.raises(ValueError, match="unknown sentencepiece type 'word-piece'"):
        build_tokenizer(corpus, tmp_path / "x", "sensevoice", 80, sp_type="word-piece")
