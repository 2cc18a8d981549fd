"""The frontend's parameters and the choices both of its implementations share: the torch one that
stage 1 writes features with (features/fbank.py, funasr's WavFrontend to the bit) and the numpy one
the deployed runtime computes them with (features/numpy_fbank.py, no torch to install). Reads and
writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class FbankConf:
    """Kaldi fbank as funasr's ``WavFrontend`` computes it; defaults are WavFrontend's own."""

    fs: int = 16000
    n_mels: int = 80
    frame_length: float = 25.0  # ms
    frame_shift: float = 10.0  # ms
    window: str = "hamming"
    lfr_m: int = 1
    lfr_n: int = 1
    snip_edges: bool = True

    def fingerprint(self) -> str:
        """Short hash of the parameters: features made with other parameters are not reused."""
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    @classmethod
    def from_frontend_conf(cls, conf: dict) -> FbankConf:
        """From a config's ``frontend_conf`` (other keys ignored), cast to the defaults' types: YAML may
        say 25 where funasr means 25.0 ms, or "16000"."""
        defaults = cls()
        return cls(**{k: type(getattr(defaults, k))(conf[k]) for k in asdict(defaults) if k in conf})

    @property
    def window_size(self) -> int:
        """Samples per frame at ``fs`` for the full frame length (Kaldi truncates, as here)."""
        return int(self.fs * self.frame_length * 0.001)

    @property
    def shift(self) -> int:
        """Samples between frame starts."""
        return int(self.fs * self.frame_shift * 0.001)


# torchaudio's sinc kernel has (new/g) x (orig/g + width) taps for g = gcd(orig, new): 282k for 11025 ->
# 16000 Hz, but 256M (5-9 GB while it is built) for 16001 -> 16000 Hz. Above this, soxr's polyphase
# resampler, whose cost does not depend on the gcd.
MAX_SINC_TAPS = 1_000_000


def reduced(orig: int, new: int) -> tuple[int, int]:
    """The rate pair divided by its greatest common divisor: the sinc kernel's phases."""
    g = math.gcd(orig, new)
    return orig // g, new // g


def sinc_is_cheap(orig: int, new: int) -> bool:
    """True where torchaudio's sinc resampling (funasr's own, byte for byte) has a small kernel."""
    a, b = reduced(orig, new)
    return a * b <= MAX_SINC_TAPS


def to_mono(wave: np.ndarray) -> np.ndarray:
    """(samples,) or (samples, channels) float audio -> (samples,) float32, channels averaged."""
    if wave.ndim == 2:
        wave = wave.mean(axis=1) if wave.shape[1] > 1 else wave[:, 0]
    return np.ascontiguousarray(wave, dtype=np.float32)
