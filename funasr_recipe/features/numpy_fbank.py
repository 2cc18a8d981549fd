"""The frontend in numpy alone, for the deployed runtime: a CPU service must not install torch (about
7 GB with its CUDA wheels) to compute 80 mel bins.

The same steps as features/fbank.py, which stage 1 writes features with (torchaudio's sinc resampler,
then ``torchaudio.compliance.kaldi.fbank`` with WavFrontend's options): the resampling kernel is
torchaudio's, built the same way (float64, then float32) and applied as its strided convolution; the
fbank is Kaldi's framing, DC removal, pre-emphasis, window, power spectrum, mel banks and log. The
spectrum is numpy's float64 FFT where torch's is float32, so the two differ by rounding only:
``feature_difference`` and its tolerances say how far, tests/unit/features/test_numpy_fbank.py checks
them on generated and real audio, and stage 4 gates every export's dev set on them.
Rates whose sinc kernel would be huge (16001 Hz) go to soxr, as in features/fbank.py. Reads audio
files (``from_file``); writes nothing.

  NumpyFbank(FbankConf(lfr_m=7, lfr_n=6)).from_wave(samples, 44100)   # (frames, 80) float32
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import soxr
from threadpoolctl import threadpool_limits

from funasr_recipe.features.audio import load_audio
from funasr_recipe.features.fbank_conf import FbankConf, reduced, sinc_is_cheap, to_mono

LOWPASS_WIDTH = 6  # torchaudio.functional.resample's defaults, which funasr's loader uses
ROLLOFF = 0.99
EPS = np.finfo(np.float32).eps  # Kaldi's floor under the log
# How far these features may be from the training frontend's, in log-mel units. Rounding puts the
# 99.9th percentile of |difference| near 1e-4, but a bin whose power is ~1e-10 of the frame's loudest
# is below a float32 FFT's resolution, and there torch's value is noise: up to ~0.015 seen on real
# speech. A wrong window, mel bank, pre-emphasis or resampler moves most values by 0.05-5.
P999_TOLERANCE = 1e-3
MAX_TOLERANCE = 0.05


@lru_cache(maxsize=32)
def sinc_kernel(orig: int, new: int) -> tuple[np.ndarray, int]:
    """(new, taps) float32 kernel and its half width for reduced rates ``orig`` -> ``new``, as
    torchaudio's ``_get_sinc_resample_kernel`` (sinc_interp_hann) builds it."""
    base = min(orig, new) * ROLLOFF
    width = math.ceil(LOWPASS_WIDTH * orig / base)
    idx = np.arange(-width, width + orig, dtype=np.float64)[None] / orig
    # torchaudio divides this integer range in float32 (the default dtype) before adding idx.
    phase = (np.arange(0, -new, -1, dtype=np.float32) / np.float32(new)).astype(np.float64)[:, None]
    t = np.clip((phase + idx) * base, -LOWPASS_WIDTH, LOWPASS_WIDTH)
    window = np.cos(t * math.pi / LOWPASS_WIDTH / 2) ** 2
    t *= math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        kernel = np.where(t == 0, 1.0, np.sin(t) / t)
    return (kernel * (window * (base / orig))).astype(np.float32), width


def sinc_resample(waves: list[np.ndarray], orig: int, new: int) -> list[np.ndarray]:
    """(samples,) float32 clips from ``orig`` to ``new`` Hz with torchaudio's kernel, each of its length
    ceil(n * new / orig), as torchaudio resamples each one alone.

    torchaudio pads a clip with ``width`` zeros before and ``width + orig`` after and runs a conv1d of
    stride ``orig``: output block j, phase p, is kernel[p] . padded[j*orig : j*orig + taps]. Here the
    padded clips lie end to end, each starting on a multiple of the stride, so one product computes
    every clip's windows (per-call overhead, not arithmetic, is most of a short clip's cost) and no
    window reaches into a neighbour; the product with the kernel is made per clip.
    """
    a, b = reduced(orig, new)
    kernel, width = sinc_kernel(a, b)
    starts, pos = [], 0
    for wave in waves:
        starts.append(pos)
        pos += -(-(len(wave) + 2 * width + a) // a) * a
    joined = np.zeros(pos, dtype=np.float32)
    for wave, start in zip(waves, starts, strict=True):
        joined[start + width: start + width + len(wave)] = wave
    windows = np.lib.stride_tricks.sliding_window_view(joined, kernel.shape[1])[::a]
    out = []
    for wave, start in zip(waves, starts, strict=True):
        n = math.ceil(b * len(wave) / a)
        # One product per clip, of its own blocks only: OpenBLAS's sgemm rounds a row differently with
        # the number of rows on some CPUs (its Zen kernels), so a product over the joined clips would
        # not give each clip's values as alone.
        out.append((windows[start // a: start // a + -(-n // b)] @ kernel.T).reshape(-1)[:n])
    return out


def change_rate(wave: np.ndarray, orig: int, new: int) -> np.ndarray:
    """(samples,) float32 audio from ``orig`` to ``new`` Hz: the sinc kernel where it is small, soxr's
    polyphase resampler otherwise (as features/fbank.py chooses)."""
    if orig == new:
        return wave
    if sinc_is_cheap(orig, new):
        return sinc_resample([wave], orig, new)[0]
    return soxr.resample(wave, orig, new, quality="HQ").astype(np.float32, copy=False)


def mono_at_rate(wave: np.ndarray, rate: int, fs: int) -> np.ndarray:
    """Audio as read (any channels, ``rate`` Hz) -> mono float32 at ``fs`` with the training resampler:
    what a runtime that is handed arrays (the server, sherpa-onnx) must be given to see stage 1's audio."""
    return change_rate(to_mono(wave), rate, fs)


@lru_cache(maxsize=32)
def window_function(kind: str, size: int) -> np.ndarray:
    """Kaldi's analysis windows (torchaudio's ``_feature_window_function``, blackman coefficient 0.42)."""
    n = np.arange(size, dtype=np.float64)
    denom = max(size - 1, 1)
    hann = 0.5 - 0.5 * np.cos(2 * math.pi * n / denom)
    windows = {
        "hanning": lambda: hann,
        "hamming": lambda: 0.54 - 0.46 * np.cos(2 * math.pi * n / denom),
        "povey": lambda: hann ** 0.85,
        "rectangular": lambda: np.ones(size),
        "blackman": lambda: 0.42 - 0.5 * np.cos(2 * math.pi * n / denom)
        + 0.08 * np.cos(4 * math.pi * n / denom),
    }
    if kind not in windows:
        raise ValueError(f"unknown fbank window {kind!r}: one of {', '.join(windows)}")
    window = windows[kind]().astype(np.float32)
    window.flags.writeable = False  # cached: shared by every caller
    return window


def _mel(f: np.ndarray | float) -> np.ndarray:
    return 1127.0 * np.log(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


@lru_cache(maxsize=64)
def mel_matrix(n_mels: int, padded: int, fs: int) -> np.ndarray:
    """(padded/2 + 1, n_mels) triangular mel filters from 20 Hz to Nyquist, Kaldi's, with the Nyquist
    bin's row zero as ``kaldi.fbank`` pads it."""
    low, high = _mel(20.0), _mel(fs / 2)
    delta = (high - low) / (n_mels + 1)
    left = low + np.arange(n_mels, dtype=np.float64)[:, None] * delta
    center, right = left + delta, left + 2 * delta
    mel = _mel(fs / padded * np.arange(padded // 2))[None]
    banks = np.maximum(0.0, np.minimum((mel - left) / (center - left), (right - mel) / (right - center)))
    matrix = np.pad(banks, ((0, 0), (0, 1))).T.astype(np.float32)
    matrix.flags.writeable = False  # cached: shared by every caller
    return matrix


def frame_signal(wave: np.ndarray, window_size: int, shift: int, snip_edges: bool) -> np.ndarray:
    """(frames, window_size) of a 1-D signal by Kaldi's framing: whole windows only, or with
    ``snip_edges`` false one frame per shift and the ends mirrored (sample 0 repeated, as Kaldi)."""
    if snip_edges:
        if len(wave) < window_size:
            return np.zeros((0, window_size), dtype=wave.dtype)
        count = 1 + (len(wave) - window_size) // shift
    else:
        count = (len(wave) + shift // 2) // shift
        pad = window_size // 2 - shift // 2
        flipped = wave[::-1]
        wave = (np.concatenate([flipped[len(flipped) - pad:], wave, flipped]) if pad > 0
                else np.concatenate([wave[-pad:], flipped]))
    return np.lib.stride_tricks.as_strided(wave, (count, window_size), (shift * wave.strides[0],
                                                                         wave.strides[0]), writeable=False)


def log_mel(frames: np.ndarray, window: np.ndarray, mel: np.ndarray,
            clips: list[int] | None = None) -> np.ndarray:
    """(frames, n_mels) float32 log mel energies of (frames, window) float32 samples; each frame on its
    own. float32 throughout, in torchaudio's order (DC removal, pre-emphasis as a product then a
    difference, window), but for numpy's FFT, which computes in float64. ``clips``: the number of frames
    of each clip stacked in ``frames`` (default: one clip), whose mel products are made apart."""
    x = frames - frames.mean(axis=1, keepdims=True, dtype=np.float32)
    emphasised = x.copy()
    emphasised[:, 1:] -= np.float32(0.97) * x[:, :-1]
    emphasised[:, 0] -= np.float32(0.97) * x[:, 0]
    emphasised *= window
    spec = np.fft.rfft(emphasised, n=2 * (mel.shape[0] - 1)).view(np.float64)
    np.square(spec, out=spec)
    power = (spec[:, 0::2] + spec[:, 1::2]).astype(np.float32)
    # Per clip, as sinc_resample's products: a row's rounding in sgemm may depend on the rows beside it.
    parts = np.split(power, np.cumsum(clips)[:-1]) if clips else [power]
    energies = np.concatenate([part @ mel for part in parts]) if len(parts) > 1 else power @ mel
    return np.log(np.maximum(energies, EPS, out=energies), out=energies)


def feature_difference(ours: list[np.ndarray], ref: list[np.ndarray]) -> tuple[float, float]:
    """(99.9th percentile, largest) |difference| over every value of pairs of equal-shaped feature
    matrices; both 0.0 when there are no values."""
    diff = np.concatenate([np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).ravel()
                           for a, b in zip(ours, ref, strict=True)] or [np.zeros(0, np.float32)])
    return (float(np.quantile(diff, 0.999)), float(diff.max())) if diff.size else (0.0, 0.0)


def within_tolerance(p999: float, largest: float) -> bool:
    """Whether a ``feature_difference`` is the rounding this module allows."""
    return p999 <= P999_TOLERANCE and largest <= MAX_TOLERANCE


_BLAS_LIMITED: list[bool] = []


def one_blas_thread() -> None:
    """numpy's BLAS (OpenBLAS in its wheels) on one thread, for the whole process, once.

    Its gemm starts a thread per core for the frontend's products (the mel bank over a batch's frames,
    the resampler's kernel at 44.1 kHz), and its threads spin after each call: in a runtime whose cores
    belong to onnxruntime they took them, 650-680 against 850-920 utterances/s at batch 8 on 2 cores
    (bench/bench_runtime.py). OpenBLAS has one setting per process, so it is set here, where a
    frontend is built, not per call; threadpoolctl does it for whichever BLAS numpy was built with.
    """
    if not _BLAS_LIMITED:
        threadpool_limits(limits=1, user_api="blas")
        _BLAS_LIMITED.append(True)


class NumpyFbank:
    """WavFrontend's fbank with dither off, in numpy: same window, mel bins, framing and scaling as
    features/fbank.py's ``FbankExtractor``, and the same methods. Building one limits numpy's BLAS to
    one thread for the process (``one_blas_thread``)."""

    def __init__(self, conf: FbankConf) -> None:
        self.conf = conf
        one_blas_thread()

    def _scaled(self, waves: list[tuple[np.ndarray, int]]) -> list[np.ndarray]:
        """Each clip mono at ``fs`` and scaled to the int16 range, as WavFrontend; the clips of one rate
        resampled together (``sinc_resample``), each as alone."""
        fs, out = self.conf.fs, [to_mono(w) for w, _ in waves]
        for rate in {r for _, r in waves} - {fs}:
            index = [i for i, (_, r) in enumerate(waves) if r == rate]
            if sinc_is_cheap(rate, fs):
                for i, x in zip(index, sinc_resample([out[i] for i in index], rate, fs), strict=True):
                    out[i] = x
            else:
                for i in index:
                    out[i] = change_rate(out[i], rate, fs)
        return [x * np.float32(1 << 15) for x in out]

    def _fbank(self, x: np.ndarray) -> np.ndarray:
        # WavFrontend shortens the window for a clip under one frame; the size is its float arithmetic.
        conf = self.conf
        size = int(conf.fs * min(conf.frame_length, len(x) / conf.fs * 1000) * 0.001)
        if size < 2:
            raise ValueError(f"{len(x)} samples at {conf.fs} Hz: too short for a fbank frame")
        frames = frame_signal(x, size, conf.shift, conf.snip_edges)
        padded = 1 << (size - 1).bit_length()
        return log_mel(frames, window_function(conf.window, size), mel_matrix(conf.n_mels, padded, conf.fs))

    def from_wave(self, wave: np.ndarray, rate: int) -> np.ndarray:
        """(frames, n_mels) float32 from (samples,) or (samples, channels) float audio in [-1, 1]."""
        return self._fbank(self._scaled([(wave, rate)])[0])

    def from_waves(self, waves: list[tuple[np.ndarray, int]]) -> list[np.ndarray]:
        """``from_wave`` of several (audio, rate) clips, the full-length ones in one FFT call."""
        conf, scaled = self.conf, self._scaled(waves)
        full = [i for i, x in enumerate(scaled) if len(x) >= conf.window_size]
        out = {i: self._fbank(x) for i, x in enumerate(scaled) if len(x) < conf.window_size}
        if full:
            parts = [frame_signal(scaled[i], conf.window_size, conf.shift, conf.snip_edges) for i in full]
            padded = 1 << (conf.window_size - 1).bit_length()
            feats = log_mel(np.concatenate(parts), window_function(conf.window, conf.window_size),
                            mel_matrix(conf.n_mels, padded, conf.fs), [len(p) for p in parts])
            out.update(zip(full, np.split(feats, np.cumsum([len(p) for p in parts])[:-1]), strict=True))
        return [out[i] for i in range(len(waves))]

    def from_file(self, source: str) -> np.ndarray:
        """fbank of an audio file or Kaldi pipe; raises ``features.audio.AudioError`` on bad audio."""
        return self.from_wave(*load_audio(source))
