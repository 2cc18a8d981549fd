"""Build the sentencepiece tokenizer of a from-scratch model from the training transcripts.

Reads  a funasr JSONL (data/<train>/data.jsonl; the ``target`` and ``text_language`` of each line);
writes <out-dir>/<model file>, <out-dir>/tokens.json (every piece, in id order) and
<out-dir>/tokenizer.json (what was built, from what, with which transcript normalisation).

The tokenizer learns the transcripts as data/textnorm.py normalises them (the config's
``transcript_norm``; default NFKC and upper case), the same text that stage 1 then writes into each
utterance's target (features/targets.py), so that ``Four``, ``FOUR`` and ``ＦＯＵＲ`` are one piece.

  build_tokenizer(Path("data/train/data.jsonl"), Path("dump/tokenizer/x"), kind="bpe", vocab_size=500)

Kinds:
  bpe, unigram, char, word   tokenizer.model for Conformer-CTC / Paraformer: 0 <blank>, 1 <s>, 2 </s>,
                             3 <unk>, because funasr's CTC takes blank_id 0 and Paraformer sos=1, eos=2.
  sensevoice                 chn_jpn_yue_eng_ko_spectok.bpe.model for the unmodified funasr
                             SenseVoiceSmall, which hard-codes token ids of the released tokenizer:
                             learned pieces first, the tags of data/tags.py at fixed ids
                             from 24884, unused filler pieces in between, 25055 pieces in all.
                             Trained with the dummy prefix (every word-initial piece is "▁X") and
                             encoded through SenseVoiceTagTokenizer (model/sensevoice_tokenizer.py),
                             which keeps each tag one token; check_tags verifies that with the class
                             the config names.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_pb2

from funasr_recipe.core.files import write_atomic
from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.textnorm import FROM_SCRATCH, TextNorm
from funasr_recipe.model.sensevoice_vocab import (
    FIRST_TAG_ID,
    SENSEVOICE_TAG_IDS,
    SENSEVOICE_TOKENIZER,
    SENSEVOICE_VOCAB_SIZE,
)

log = logging.getLogger(__name__)

PLAIN_KINDS = ("bpe", "unigram", "char", "word")
ENCODE_SLICE = 1 << 14  # transcripts encoded at a time by the round-trip check
KINDS = (*PLAIN_KINDS, "sensevoice")
# The file names the runtimes look for: funasr-onnx's SenseVoiceSmall loads the sensevoice one from
# the model dir by this exact name.
MODEL_FILE = {"sensevoice": "chn_jpn_yue_eng_ko_spectok.bpe.model",
              **{kind: "tokenizer.model" for kind in PLAIN_KINDS}}


def model_file_name(kind: str) -> str:
    """File name of the sentencepiece model that build_tokenizer writes for this kind."""
    if kind not in MODEL_FILE:
        raise BadInputError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(KINDS)}")
    return MODEL_FILE[kind]


def read_targets(jsonl: Path, norm: TextNorm | None = None) -> list[str]:
    """The ``target`` of every line of a funasr JSONL, normalised by ``norm`` in the line's
    ``text_language`` (as they are for None); ValueError naming file:line on a bad line."""
    targets = []
    for lineno, obj in iter_jsonl(jsonl):
        where = f"{jsonl}:{lineno}"
        target = obj.get("target")
        if not isinstance(target, str):
            raise BadInputError(f"{where}: no string 'target' field")
        if norm is not None:
            target = norm(target, obj.get("text_language"))
        if not target.strip():
            raise BadInputError(f"{where}: empty transcript (key {obj.get('key', '?')}); fix or drop it in "
                                "stage 0")
        targets.append(target)
    if not targets:
        raise BadInputError(f"{jsonl}: no transcripts")
    return targets


def _train(texts: list[str], model_type: str, vocab_size: int, **ids: int | str | bool) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=out, model_type=model_type, vocab_size=vocab_size,
        # A digit corpus has ~90 possible BPE pieces: ask for 500 and get what the data holds.
        hard_vocab_limit=False,
        # char: every character, whatever vocab_size says, or rare ones would decode as <unk>.
        use_all_vocab=model_type == "char",
        character_coverage=1.0,
        # No sentencepiece NFKC: the texts are already normalised by data/textnorm.py, the one
        # normaliser, and a second one inside the model would make its decoded text differ from the
        # target it was trained on (stage 1 lists such targets in untokenizable.tsv).
        normalization_rule_name="identity",
        # Bound memory on large corpora; a sample of 2M sentences is plenty for a vocabulary.
        input_sentence_size=2_000_000, shuffle_input_sentence=True,
        minloglevel=2, **ids)
    return out.getvalue()


def _add_sensevoice_tags(model: bytes) -> bytes:
    proto = sp_pb2.ModelProto()
    proto.ParseFromString(model)
    learned = len(proto.pieces)
    if learned > FIRST_TAG_ID:
        raise BadInputError(f"{learned} learned pieces do not fit below the first SenseVoice tag id "
                            f"{FIRST_TAG_ID}; lower --vocab-size")
    # "▁<|en|>": a tag learned word-initially, as the dummy prefix has it.
    clash = {p.piece.removeprefix("▁") for p in proto.pieces} & set(SENSEVOICE_TAG_IDS)
    if clash:
        raise BadInputError(f"transcripts contain tag strings {sorted(clash)} often enough to be learned "
                            "as pieces; tags belong in the tag fields of the JSONL, not in 'target'")
    tag_at = {i: tag for tag, i in SENSEVOICE_TAG_IDS.items()}
    for i in range(learned, SENSEVOICE_VOCAB_SIZE):
        piece = proto.pieces.add()
        piece.score = 0.0
        if i in tag_at:
            # USER_DEFINED pieces are matched whole before segmentation, so a tag is one token.
            piece.piece, piece.type = tag_at[i], sp_pb2.ModelProto.SentencePiece.USER_DEFINED
        else:
            # UNUSED pieces are never produced by encoding; they only hold ids in place.
            piece.piece, piece.type = f"<unused_{i}>", sp_pb2.ModelProto.SentencePiece.UNUSED
    proto.trainer_spec.vocab_size = SENSEVOICE_VOCAB_SIZE
    return proto.SerializeToString()


def _report_round_trip(sp: spm.SentencePieceProcessor, texts: list[str]) -> None:
    # Counted, not fatal: a word vocabulary smaller than the corpus's words is a legitimate choice.
    # The keys are stage 1's to give: its target check lists each such utterance (features/targets.py).
    # In slices: the ids of a whole corpus at once are a Python int per token.
    slices = (texts[start : start + ENCODE_SLICE] for start in range(0, len(texts), ENCODE_SLICE))
    bad = sum(sp.decode(ids) != t for part in slices for t, ids in zip(part, sp.encode(part), strict=True))
    if bad:
        log.warning("%d of %d normalised transcripts do not survive encode/decode (unknown characters or "
                    "words); stage 1 lists each, with its key, in <dump-dir>/<set>/untokenizable.tsv",
                    bad, len(texts))


def build_tokenizer(jsonl: Path, out_dir: Path, kind: str, vocab_size: int, sp_type: str = "bpe",
                    tokenizer: str | None = None, text_norm: TextNorm | None = None) -> Path:
    """Train the tokenizer of `kind` on the targets of `jsonl`, write it into `out_dir`, return its path.

    The targets are normalised by `text_norm` (data/textnorm.py ``from_config`` of the model config;
    default FROM_SCRATCH, NFKC and upper case) first: stage 1 must normalise every utterance's target
    with the same policy, or training would tokenise text the vocabulary was not learned from.

    `sp_type` is the sentencepiece model type under the tags of the ``sensevoice`` kind; the plain
    kinds are their own model type and ignore it. `tokenizer`: the funasr tokenizer class that training
    will encode with (the config's ``tokenizer``); the ``sensevoice`` kind's tags are checked through it
    (default SENSEVOICE_TOKENIZER).
    """
    jsonl, out_dir = Path(jsonl), Path(out_dir)
    model_path = out_dir / model_file_name(kind)
    if vocab_size < 1:
        raise BadInputError(f"vocab size must be positive, got {vocab_size}")
    text_norm = text_norm or FROM_SCRATCH
    texts = read_targets(jsonl, text_norm)
    if kind == "sensevoice":
        if sp_type not in PLAIN_KINDS:
            raise BadInputError(f"unknown sentencepiece type {sp_type!r}; "
                                f"choose one of {', '.join(PLAIN_KINDS)}")
        if vocab_size > FIRST_TAG_ID:
            raise BadInputError(f"--vocab-size {vocab_size}: SenseVoice's learned pieces must fit below "
                                f"{FIRST_TAG_ID}, the first tag id")
        # Released layout: <unk> 0 (SenseVoiceSmall's CTC blank), <s> 1, </s> 2. The dummy prefix gives
        # the first word of a line its "▁" as every other word has: without it the vocabulary held
        # "ZERO" and "▁ZERO" and CTC output lost word boundaries. It would make a tag encoded on its
        # own ("▁", "<|en|>") two tokens; SENSEVOICE_TOKENIZER encodes tags apart from the text.
        model = _train(texts, sp_type, vocab_size, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                       add_dummy_prefix=True)
    else:
        sp_type = kind
        model = _train(texts, kind, vocab_size, pad_id=0, pad_piece="<blank>", bos_id=1, eos_id=2,
                       unk_id=3)
    learned = spm.SentencePieceProcessor(model_proto=model).get_piece_size()
    if kind == "sensevoice":
        model = _add_sensevoice_tags(model)
    sp = spm.SentencePieceProcessor(model_proto=model)
    _report_round_trip(sp, texts)

    out_dir.mkdir(parents=True, exist_ok=True)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    info: dict[str, object] = {
        "kind": kind, "sp_type": sp_type, "vocab_size": len(pieces), "requested_vocab_size": vocab_size,
        "learned_pieces": learned, "model_file": model_path.name, "jsonl": str(jsonl),
        "num_transcripts": len(texts), "transcript_norm": text_norm.describe(),
    }
    if kind == "sensevoice":
        info["tag_ids"] = SENSEVOICE_TAG_IDS
        info["tokenizer_class"] = tokenizer or SENSEVOICE_TOKENIZER
    # Atomically: a reader on another node (shared filesystem) sees the old file or the new one.
    write_atomic(model_path, model)
    write_atomic(out_dir / "tokens.json", json.dumps(pieces, ensure_ascii=False, indent=0))
    write_atomic(out_dir / "tokenizer.json", json.dumps(info, ensure_ascii=False, indent=2))
    if kind == "sensevoice":
        check_tags(model_path, tokenizer or SENSEVOICE_TOKENIZER)
    log.info("%s tokenizer (%s): %d pieces learned from %d transcripts (asked for %d), %d in all -> %s",
             kind, sp_type, learned, len(texts), vocab_size, len(pieces), model_path)
    return model_path


def check_tags(model_path: Path, tokenizer: str = SENSEVOICE_TOKENIZER) -> None:
    """Raise ValueError naming the first SenseVoice tag that is not exactly one token at its id.

    Encodes as SenseVoiceCTCDataset does, one tag at a time, through `tokenizer`: the funasr tokenizer
    class (registered name) that training uses, built on `model_path`.
    """
    from funasr.register import tables

    import funasr_recipe.model.sensevoice_tokenizer  # noqa: F401  (registers SENSEVOICE_TOKENIZER)

    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    if sp.get_piece_size() != SENSEVOICE_VOCAB_SIZE:
        raise BadInputError(f"{model_path}: {sp.get_piece_size()} pieces; SenseVoiceSmall needs "
                            f"{SENSEVOICE_VOCAB_SIZE}")
    cls = tables.tokenizer_classes.get(tokenizer)
    if cls is None:
        raise BadInputError(f"tokenizer {tokenizer!r} is not registered with funasr; a from-scratch "
                            f"SenseVoice names {SENSEVOICE_TOKENIZER}")
    tok = cls(bpemodel=str(model_path))
    for tag, want in SENSEVOICE_TAG_IDS.items():
        got = tok.encode(tag, allowed_special="all")
        if got != [want]:
            hint = "" if tokenizer == SENSEVOICE_TOKENIZER else (
                f"; this tokenizer needs `tokenizer: {SENSEVOICE_TOKENIZER}` in the config")
            raise BadInputError(f"{model_path}: tag {tag} encodes to {got} with {tokenizer}, SenseVoiceSmall "
                                f"needs [{want}]{hint}")
