"""Exports whose tokenizer joins several words in one piece, for the runtimes' word-joining tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import sentencepiece as spm
import yaml
from onnx import TensorProto, helper

from funasr_recipe.features.cmvn import write_am_mvn
from funasr_recipe.model.tokenizer import build_tokenizer, model_file_name
from funasr_recipe.runtime.sherpa_onnx_export import write_sherpa_files

ROOT = Path(__file__).resolve().parents[2]


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
