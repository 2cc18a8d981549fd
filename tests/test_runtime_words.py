"""Every runtime joins SenseVoice's word pieces into the same words: the PyTorch model's tokenizer (the
class tiny_sensevoice.yaml names, from funasr's registry, as AutoModel builds it), the recipe's runtime
(OnnxASR), funasr-onnx's SenseVoiceSmall and sherpa-onnx.

The network is a tiny ONNX graph with the SenseVoice export's inputs and outputs (speech, speech_lengths,
language, textnorm -> ctc_logits, encoder_out_lens) whose logits peak at a chosen token sequence: the 4
prompt tags, then the pieces of "NINE ZERO" from a tokenizer that build_tokenizer makes from multi-word
transcripts (the config's word pieces, and BPE pieces that split a word), blank on every other frame.
It sits in an export dir with config.yaml, am.mvn, the tokenizer and sherpa-onnx's files
(runtime/sherpa_onnx_export.py), so every runtime loads it as it loads a real export, and each computes
its own features from a real file and decodes with its own code.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import sentencepiece as spm
import soundfile as sf
import yaml
from onnx import TensorProto, helper

from funasr_recipe.data.tags import strip_tags
from funasr_recipe.features.cmvn import write_am_mvn
from funasr_recipe.model.tokenizer import build_tokenizer, model_file_name
from funasr_recipe.runtime.onnx_asr import OnnxASR
from funasr_recipe.runtime.sherpa_onnx_export import write_sherpa_files
from funasr_recipe.runtime.sherpa_onnx_runtime import sherpa_subprocess

ROOT = Path(__file__).resolve().parents[1]
WORDS = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()
PROMPT = ("<|en|>", "<|NEUTRAL|>", "<|Speech|>", "<|woitn|>")
MAX_FRAMES = 200  # output frames the graph can give: 4 prompt frames + 196 LFR frames (11.7 s of audio)
FRONTEND = {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
            "lfr_m": 7, "lfr_n": 6, "dither": 0.0}


def peaked_graph(frames: list[int], vocab: int, path: Path) -> None:
    """An ONNX graph with SenseVoice's export interface: logits (B, T + 4, vocab) that peak at
    ``frames[t]`` on frame t (blank 0 after them), and encoder_out_lens = speech_lengths + 4."""
    best = np.zeros(MAX_FRAMES, dtype=np.int64)
    best[: len(frames)] = frames
    consts = [helper.make_tensor(name, kind, [len(values)], values) for name, kind, values in (
        ("best", TensorProto.INT64, best.tolist()), ("depth", TensorProto.INT64, [vocab]),
        ("off_on", TensorProto.FLOAT, [-10.0, 10.0]), ("zero", TensorProto.INT64, [0]),
        ("one", TensorProto.INT64, [1]), ("two", TensorProto.INT64, [2]), ("four", TensorProto.INT64, [4]),
        ("four32", TensorProto.INT32, [4]))]
    nodes = [
        helper.make_node("Shape", ["speech"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["batch"]),
        helper.make_node("Slice", ["shape", "one", "two"], ["time"]),
        helper.make_node("Add", ["time", "four"], ["out_time"]),
        helper.make_node("OneHot", ["best", "depth", "off_on"], ["table"]),  # (MAX_FRAMES, vocab)
        helper.make_node("Slice", ["table", "zero", "out_time", "zero"], ["rows"]),
        helper.make_node("Unsqueeze", ["rows", "zero"], ["rows1"]),
        helper.make_node("Concat", ["batch", "out_time", "depth"], ["out_shape"], axis=0),
        helper.make_node("Expand", ["rows1", "out_shape"], ["ctc_logits"]),
        helper.make_node("Add", ["speech_lengths", "four32"], ["encoder_out_lens"]),
    ]
    inputs = [helper.make_tensor_value_info("speech", TensorProto.FLOAT, ["batch_size", "feats_length", 560]),
              *[helper.make_tensor_value_info(n, TensorProto.INT32, ["batch_size"])
                for n in ("speech_lengths", "language", "textnorm")]]
    outputs = [helper.make_tensor_value_info("ctc_logits", TensorProto.FLOAT,
                                             ["batch_size", "logits_length", vocab]),
               helper.make_tensor_value_info("encoder_out_lens", TensorProto.INT32, ["batch_size"])]
    graph = helper.make_graph(nodes, "peaked_sensevoice", inputs, outputs, initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8  # what the onnxruntime inside sherpa-onnx reads, as funasr's export writes
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def tiny_config() -> dict:
    return yaml.safe_load((ROOT / "conf" / "tiny_sensevoice.yaml").read_text())


def multi_word_tokenizer(root: Path, sp_type: str, vocab_size: int) -> Path:
    """The from-scratch SenseVoice tokenizer built on multi-word digit transcripts."""
    lines = [" ".join(WORDS[(3 * i + 7 * j) % 10] for j in range(1 + i % 4)) for i in range(80)]
    jsonl = root / "text.jsonl"
    jsonl.write_text("".join(json.dumps({"key": f"u{i}", "target": t}) + "\n" for i, t in enumerate(lines)))
    return build_tokenizer(jsonl, root / "tokenizer", "sensevoice", vocab_size, sp_type)


def words_export(root: Path, tokenizer: Path, pieces: list[str]) -> Path:
    """An export dir (every file a SenseVoiceSmall export has, sherpa-onnx's too) whose graph emits the
    prompt tags then ``pieces``, a blank between each two."""
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    ids = [sp.piece_to_id(p) for p in (*PROMPT, *pieces)]
    assert all(sp.id_to_piece(i) == p for i, p in zip(ids, (*PROMPT, *pieces), strict=True)), pieces
    frames = [x for i in ids for x in (i, 0)]
    out = root / "export"
    out.mkdir()
    peaked_graph(frames, sp.get_piece_size(), out / "model.onnx")
    shutil.copyfile(out / "model.onnx", out / "model_quant.onnx")
    shutil.copyfile(tokenizer, out / model_file_name("sensevoice"))
    write_am_mvn(out / "am.mvn", np.zeros(560), np.ones(560))
    config = {"model": "SenseVoiceSmall", "model_conf": {}, "frontend": "WavFrontend",
              "frontend_conf": FRONTEND, "tokenizer": tiny_config()["tokenizer"],
              "tokenizer_conf": {"bpemodel": model_file_name("sensevoice"), "unk_symbol": "<unk>"}}
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    (out / "export.json").write_text(json.dumps({"family": "SenseVoiceSmall"}))
    (out / "tokens.json").write_text(json.dumps([sp.id_to_piece(i) for i in range(sp.get_piece_size())]))
    assert len(write_sherpa_files(out)) == 3
    return out


def every_runtime(export: Path, wav: Path) -> dict[str, str]:
    """The text each runtime gives for ``wav`` on ``export``, SenseVoice's tags stripped."""
    from funasr.register import tables
    from funasr_onnx import SenseVoiceSmall

    from funasr_recipe.model.trainer import register_recipe_classes

    sp = spm.SentencePieceProcessor(model_file=str(export / model_file_name("sensevoice")))
    asr = OnnxASR(export, threads=1)
    feats = asr.features([str(wav)])
    scores, lengths = asr.infer(feats)
    ids = asr.parts.token_ids(scores[0, : lengths[0]].argmax(axis=-1))  # greedy CTC, as AutoModel's
    register_recipe_classes()  # the config may name the recipe's tokenizer class
    config = yaml.safe_load((export / "config.yaml").read_text())
    bpemodel = str(export / model_file_name("sensevoice"))
    pytorch = tables.tokenizer_classes[config["tokenizer"]](bpemodel=bpemodel).decode(ids)
    assert sp.decode(ids) == pytorch
    funasr_onnx = SenseVoiceSmall(str(export), batch_size=1, intra_op_num_threads=1)([str(wav)])[0]
    return {"pytorch_tokenizer": strip_tags(pytorch), "ours": strip_tags(asr([str(wav)])[0]),
            "funasr_onnx": strip_tags(funasr_onnx), "sherpa_onnx": sherpa_subprocess(export, [str(wav)])[0]}


@pytest.fixture(scope="module", params=["config", "bpe"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pieces of tiny_sensevoice.yaml's type (words), and BPE pieces too few for whole words (a word is
    several pieces, only the first of them marked)."""
    root = tmp_path_factory.mktemp(f"tok_{request.param}")
    if request.param == "config":
        return multi_word_tokenizer(root, tiny_config()["build_tokenizer"].get("sp_type", "bpe"), 64)
    return multi_word_tokenizer(root, "bpe", 24)


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1.5 s of a tone at 16 kHz (the graph ignores the audio's values, not its length)."""
    path = tmp_path_factory.mktemp("wav") / "tone.wav"
    t = np.arange(24000) / 16000
    sf.write(path, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000)
    return path


def test_two_words_decode_alike_with_a_space(tokenizer: Path, wav: Path, tmp_path: Path) -> None:
    """"NINE ZERO" from every runtime, the pieces of each word joined and a space between the words
    (sherpa-onnx's text starts with the first word's "▁" as a space; sentencepiece drops it)."""
    pieces = spm.SentencePieceProcessor(model_file=str(tokenizer)).encode("NINE ZERO", out_type=str)
    texts = every_runtime(words_export(tmp_path, tokenizer, pieces), wav)
    assert texts == dict.fromkeys(texts, "NINE ZERO"), (pieces, texts)
