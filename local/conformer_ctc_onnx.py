"""onnxruntime runner for the recipe's Conformer-CTC export: what funasr-onnx's classes are for
SenseVoiceSmall and Paraformer (funasr-onnx has no CTC-only class).

Reads an export dir written by local/export.py: config.yaml (frontend_conf, tokenizer_conf.bpemodel,
model_conf.blank_id), am.mvn, the sentencepiece model, and model.onnx or model_quant.onnx. Needs
neither torch nor funasr: fbank, LFR and CMVN are funasr-onnx's own ``WavFrontend`` (kaldi-native-fbank),
the frontend its SenseVoiceSmall and Paraformer classes use; audio files are read with soundfile and
resampled to the model's rate with librosa's soxr, as funasr-onnx's ``librosa.load(path, sr=fs)`` does.

  from local.conformer_ctc_onnx import ConformerCTCOnnx
  model = ConformerCTCOnnx("exp/tiny_conformer_ctc/export", batch_size=4, intra_op_num_threads=2)
  model(["a.wav", "b.wav"])  # -> ["seven", "one two"]
"""

from __future__ import annotations

import os
from pathlib import Path

import librosa
import numpy as np
import sentencepiece as spm
import yaml
from funasr_onnx.utils.frontend import WavFrontend

from local.audio import load_audio
from local.ort_utils import greedy_ctc, make_session


class ConformerCTCOnnx:
    """Transcribe audio with an exported Conformer-CTC: wav paths or 16 kHz float arrays in, texts out."""

    def __init__(self, model_dir: str | Path, batch_size: int = 1, quantize: bool = False,
                 intra_op_num_threads: int | None = None) -> None:
        model_dir = Path(model_dir)
        with open(model_dir / "config.yaml", encoding="utf-8") as f:
            config = yaml.safe_load(f)
        frontend_conf = {k: v for k, v in config["frontend_conf"].items() if k != "cmvn_file"}
        self.frontend = WavFrontend(cmvn_file=str(model_dir / "am.mvn"), **frontend_conf)
        self.fs = int(frontend_conf.get("fs", 16000))
        self.sp = spm.SentencePieceProcessor(model_file=str(model_dir / config["tokenizer_conf"]["bpemodel"]))
        self.blank_id = int((config.get("model_conf") or {}).get("blank_id", 0))
        threads = intra_op_num_threads or len(os.sched_getaffinity(0))
        self.session = make_session(model_dir / ("model_quant.onnx" if quantize else "model.onnx"), threads)
        self.batch_size = batch_size

    def load(self, item: str | np.ndarray) -> np.ndarray:
        """Mono float32 audio at the model's rate; an array is taken to be at that rate already."""
        if isinstance(item, np.ndarray):
            return item.astype(np.float32)
        data, rate = load_audio(item)
        wave = data.mean(axis=1)
        if rate != self.fs:
            wave = librosa.resample(wave, orig_sr=rate, target_sr=self.fs, res_type="soxr_hq")
        return wave.astype(np.float32)

    def features(self, waves: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Padded (B, T, D) model input and its (B,) int32 lengths."""
        feats = [self.frontend.lfr_cmvn(self.frontend.fbank(w)[0])[0] for w in waves]
        lengths = np.array([f.shape[0] for f in feats], dtype=np.int32)
        batch = np.zeros((len(feats), int(lengths.max()), feats[0].shape[1]), dtype=np.float32)
        for i, f in enumerate(feats):
            batch[i, : f.shape[0]] = f
        return batch, lengths

    def infer(self, feats: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(log_probs (B, T', V), lengths (B,)) of a padded feature batch."""
        log_probs, out_lens = self.session.run(None, {"speech": feats, "speech_lengths": lengths})
        return log_probs, out_lens

    def __call__(self, wav_content: str | np.ndarray | list[str | np.ndarray]) -> list[str]:
        items = wav_content if isinstance(wav_content, list) else [wav_content]
        texts = []
        for start in range(0, len(items), self.batch_size):
            waves = [self.load(x) for x in items[start:start + self.batch_size]]
            log_probs, out_lens = self.infer(*self.features(waves))
            texts += [self.sp.decode(greedy_ctc(lp[:n], self.blank_id))
                      for lp, n in zip(log_probs, out_lens.tolist(), strict=True)]
        return texts
