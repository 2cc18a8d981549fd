"""model/tokenizer.py (stage 1 builds a from-scratch model's tokenizer with it) and
model/sensevoice_tokenizer.py: tag ids, word-boundary markers, round trips, special ids, and the
unmodified SenseVoiceSmall and its SenseVoiceCTCDataset.

Encoding goes through the class the trainer uses, looked up in funasr's registry by the name the
configs give: funasr's SentencepiecesTokenizer for the plain kinds, the recipe's SenseVoiceTagTokenizer
for the sensevoice kind.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from funasr.register import tables
from funasr.tokenizer.sentencepiece_tokenizer import SentencepiecesTokenizer

from funasr_recipe.data.tags import EMOTIONS, EVENTS, ITN, LANGUAGES, split_tags, strip_tags
from funasr_recipe.model.config import load_config, tokenizer_spec
from funasr_recipe.model.tokenizer import (
    KINDS,
    PLAIN_KINDS,
    SENSEVOICE_TAG_IDS,
    SENSEVOICE_TOKENIZER,
    SENSEVOICE_VOCAB_SIZE,
    _add_sensevoice_tags,
    _train,
    build_tokenizer,
    check_tags,
    model_file_name,
)
from funasr_recipe.model.trainer import register_recipe_classes

register_recipe_classes()  # as stage 2 does before funasr builds the config's tokenizer

ROOT = Path(__file__).resolve().parents[3]
DIGITS = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()
# The tokenizer class training encodes each kind with (the configs' ``tokenizer``; test_config_names_it).
TOKENIZER_OF = {"sensevoice": SENSEVOICE_TOKENIZER, **{k: "SentencepiecesTokenizer" for k in PLAIN_KINDS}}
PROMPT = ("<|en|>", "<|HAPPY|>", "<|BGM|>", "<|withitn|>")  # not the dataset's defaults


def _tokenizer(kind: str, model: Path) -> SentencepiecesTokenizer:
    """The registered class of ``kind`` on ``model``, built as funasr's AutoModel builds it."""
    return tables.tokenizer_classes[TOKENIZER_OF[kind]](bpemodel=str(model))


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
    tok = _tokenizer("sensevoice", model)
    assert type(tok).__name__ == SENSEVOICE_TOKENIZER
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
    tok = _tokenizer(kind, built[kind])
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
    tok = _tokenizer("sensevoice", built["sensevoice"])
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


# --- word-boundary markers: the first word of a line is "▁X" like every other word -------------------

SENSEVOICE_SP_TYPES = {"word": 16, "bpe": 60, "unigram": 60, "char": 60}


def _marker_doubles(pieces: list[str]) -> list[str]:
    """Words of the corpus that are a piece both without and with the word-boundary marker "▁"."""
    have = set(pieces)
    return sorted(w for w in DIGITS if w in have and f"▁{w}" in have)


def _pieces(model: Path) -> list[str]:
    sp = spm.SentencePieceProcessor(model_file=str(model))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


@pytest.fixture(scope="module")
def every_model(built: dict[str, Path], corpus: Path,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    """label -> (kind, model): the plain kinds, and the sensevoice kind over each sentencepiece type."""
    root = tmp_path_factory.mktemp("sv_types")
    models = {kind: (kind, built[kind]) for kind in PLAIN_KINDS}
    for sp_type, size in SENSEVOICE_SP_TYPES.items():
        models[f"sensevoice-{sp_type}"] = (
            "sensevoice", build_tokenizer(corpus, root / sp_type, "sensevoice", size, sp_type=sp_type))
    return models


@pytest.fixture(scope="module")
def tiny_sensevoice(corpus: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> tuple[SentencepiecesTokenizer, Path]:
    """conf/tiny_sensevoice.yaml's tokenizer built as stage 1 builds it, and its class as funasr builds it."""
    cfg = load_config(ROOT / "conf" / "tiny_sensevoice.yaml")
    model = build_tokenizer(corpus, tmp_path_factory.mktemp("tiny_sv"), **tokenizer_spec(cfg),
                            tokenizer=cfg.tokenizer)
    return tables.tokenizer_classes[cfg.tokenizer](bpemodel=str(model), **cfg.tokenizer_conf), model


@pytest.mark.parametrize("label", [*PLAIN_KINDS, *(f"sensevoice-{t}" for t in SENSEVOICE_SP_TYPES)])
def test_every_word_piece_carries_the_marker(label: str, every_model: dict[str, tuple[str, Path]]) -> None:
    kind, model = every_model[label]
    assert _marker_doubles(_pieces(model)) == [], label
    tok = _tokenizer(kind, model)
    multi = [t for t in _transcripts() if " " in t]
    assert multi
    for text in multi:
        pieces = tok.text2tokens(text)
        assert "".join(pieces) == "▁" + text.replace(" ", "▁"), (label, text, pieces)
        assert [tok.sp.IdToPiece(i) for i in tok.encode(text, allowed_special="all")] == pieces
        assert tok.decode(tok.encode(text)) == text, (label, text)


def test_the_marker_check_catches_a_model_without_the_dummy_prefix(corpus: Path) -> None:
    """What the sensevoice kind was before: the first word of a line learned without "▁"."""
    texts = _transcripts()
    model = _add_sensevoice_tags(_train(texts, "word", 40, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                        add_dummy_prefix=False))
    sp = spm.SentencePieceProcessor(model_proto=model)
    assert _marker_doubles([sp.id_to_piece(i) for i in range(sp.get_piece_size())]) != []
    assert sp.encode("NINE ZERO", out_type=str) == ["NINE", "▁ZERO"]


def test_tags_are_one_id_and_text_gets_its_marker(
        tiny_sensevoice: tuple[SentencepiecesTokenizer, Path]) -> None:
    tok, model = tiny_sensevoice
    assert type(tok).__name__ == SENSEVOICE_TOKENIZER
    for tag, want in SENSEVOICE_TAG_IDS.items():
        assert tok.encode(tag, allowed_special="all") == [want], tag
    prompt = [SENSEVOICE_TAG_IDS[t] for t in PROMPT]
    assert tok.encode("".join(PROMPT)) == prompt  # a run of tags: one id each
    assert tok.text2tokens("NINE ZERO") == ["▁NINE", "▁ZERO"]
    # funasr's SenseVoice timestamps: text2tokens(decoded text)[4:], then tokens2ids, one [id] per piece.
    pieces = tok.text2tokens("".join(PROMPT) + " NINE ZERO")
    assert pieces == [*PROMPT, "▁NINE", "▁ZERO"]
    assert tok.tokens2ids(pieces[4:]) == [[tok.sp.PieceToId("▁NINE")], [tok.sp.PieceToId("▁ZERO")]]
    # As SenseVoiceCTCDataset builds a target: each tag, then the text, encoded apart.
    ids = [i for part in (*PROMPT, "NINE ZERO") for i in tok.encode(part, allowed_special="all")]
    assert ids == [*prompt, tok.sp.PieceToId("▁NINE"), tok.sp.PieceToId("▁ZERO")]
    assert tok.encode("".join(PROMPT) + "NINE ZERO") == ids  # tags and text in one line: the same ids
    # Decoding is sentencepiece's, as in every runtime: the first word's "▁" is a space after the tags.
    decoded = tok.decode(ids)
    assert decoded == "".join(PROMPT) + " NINE ZERO"
    assert strip_tags(decoded) == "NINE ZERO"
    assert split_tags(decoded) == ({"language": "en", "emotion": "HAPPY", "event": "BGM", "itn": "withitn"},
                                   "NINE ZERO")
    check_tags(model, SENSEVOICE_TOKENIZER)
    # funasr's own class on this model gives a tag two tokens (or <unk>): stage 1 says which class to name.
    with pytest.raises(ValueError, match=f"tokenizer: {SENSEVOICE_TOKENIZER}"):
        check_tags(model, "SentencepiecesTokenizer")
    with pytest.raises(ValueError, match="not registered"):
        check_tags(model, "NoSuchTokenizer")


def test_stage1_refuses_a_config_that_names_funasrs_class(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tag <\|zh\|> encodes to .* with SentencepiecesTokenizer"):
        build_tokenizer(corpus, tmp_path, "sensevoice", 16, sp_type="word",
                        tokenizer="SentencepiecesTokenizer")


def test_configs_name_the_class_of_their_kind() -> None:
    configs = sorted((ROOT / "conf").glob("*.yaml"))
    assert configs
    for path in configs:
        cfg = load_config(path)
        spec = tokenizer_spec(cfg)
        if spec is None:  # a fine-tune: the released config.yaml's class, funasr's own
            assert cfg.get("tokenizer") in (None, "SentencepiecesTokenizer"), path.name
        else:
            assert cfg.tokenizer == TOKENIZER_OF[spec["kind"]], path.name


def test_sensevoice_dataset_targets_are_the_tags_then_marked_words(
        tiny_sensevoice: tuple[SentencepiecesTokenizer, Path], tmp_path: Path) -> None:
    """funasr's own SenseVoiceCTCDataset (raw audio) on real recordings, with the registered class."""
    from funasr.frontends.wav_frontend import WavFrontend

    from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR

    wavs = sorted(DEFAULT_WAV_DIR.glob("*.wav"))[:2]
    if len(wavs) < 2:
        pytest.skip(f"{DEFAULT_WAV_DIR}: the bundled corpus is missing")
    tok, _ = tiny_sensevoice
    targets = ["NINE ZERO", "ONE TWO THREE"]
    tags = dict(zip(("text_language", "emo_target", "event_target", "with_or_wo_itn"), PROMPT, strict=True))
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("".join(json.dumps({"key": w.stem, "source": str(w), "source_len": 1, "target": t,
                                         "target_len": 1, **tags}) + "\n"
                             for w, t in zip(wavs, targets, strict=True)), encoding="utf-8")
    frontend = WavFrontend(fs=16000, window="hamming", n_mels=80, frame_length=25, frame_shift=10, lfr_m=7,
                           lfr_n=6, dither=0.0)
    dataset = tables.dataset_classes["SenseVoiceCTCDataset"](
        str(jsonl), index_ds="IndexDSJsonl", frontend=frontend, tokenizer=tok, batch_size=100_000,
        batch_type="token")
    assert len(dataset) == 2
    prompt = [SENSEVOICE_TAG_IDS[t] for t in PROMPT]
    for i, target in enumerate(targets):
        sample = dataset[i]
        assert sample is not None and sample["speech"].shape[0] > 0
        words = [tok.sp.PieceToId(f"▁{w}") for w in target.split()]
        assert tok.sp.unk_id() not in words
        assert sample["text"].tolist() == prompt + words, target
        assert int(sample["text_lengths"]) == 4 + len(words)
