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

from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import soundfile as sf
import yaml

from funasr_recipe.data.tags import strip_tags
from funasr_recipe.model.tokenizer import model_file_name
from funasr_recipe.runtime.onnx_asr import OnnxASR
from funasr_recipe.runtime.sherpa_onnx_runtime import sherpa_subprocess
from tests.helpers.word_exports import (
    multi_word_tokenizer,
    tiny_config,
    words_export,
)


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
