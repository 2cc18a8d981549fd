"""A served model in seconds for the HTTP service's fast tests: an export whose graph answers every
piece with the prompt's tags and the words "NINE ZERO" (tests/helpers/word_exports.py), so that a test
can tell a decoded piece from one that was not, and the audio helpers the tests upload."""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import sentencepiece as spm
import soundfile as sf

from tests.helpers.word_exports import multi_word_tokenizer, tiny_config, words_export

TEXT = "NINE ZERO"


def peaked_export(root: Path) -> Path:
    """An export dir under ``root`` whose model says TEXT for any audio of up to 11.7 s."""
    tokenizer = multi_word_tokenizer(root, tiny_config()["build_tokenizer"].get("sp_type", "bpe"), 64)
    pieces = spm.SentencePieceProcessor(model_file=str(tokenizer)).encode(TEXT, out_type=str)
    return words_export(root, tokenizer, pieces)


def tone(seconds: float, fs: int = 16000, channels: int = 1) -> np.ndarray:
    """A 440 Hz tone at -12 dBFS, (frames, channels) float32."""
    t = np.arange(int(seconds * fs)) / fs
    wave = (0.25 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    return np.repeat(wave[:, None], channels, axis=1)


def encoded(wave: np.ndarray, fs: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    """``wave`` as a file soundfile writes (WAV, FLAC, OGG)."""
    buf = io.BytesIO()
    sf.write(buf, wave, fs, format=fmt, subtype=subtype)
    return buf.getvalue()


def recorded(wave: np.ndarray, fs: int, container: str) -> bytes:
    """``wave`` (mono) as browsers and phones record it: "webm" (Opus, what MediaRecorder writes in
    Chrome and Firefox) or "m4a" (AAC, Safari's and the phones' recorders), encoded with PyAV."""
    codec, fmt = {"webm": ("libopus", "webm"), "m4a": ("aac", "ipod")}[container]
    rate = 48000 if codec == "libopus" else fs
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(wave.reshape(1, -1), dtype=np.float32),
                                           format="flt", layout="mono")
        frame.sample_rate = fs
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=rate)
        for piece in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(piece):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()
