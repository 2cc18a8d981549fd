"""Kaldi fbank exactly as funasr's ``WavFrontend`` computes it, from audio read with soundfile.

Reads audio files (any rate, any channel count); returns float32 (frames, n_mels) arrays. The same
code serves stage 1 (features written once) and the parity test against ``WavFrontend``. Resampling is
torchaudio's sinc, as funasr's own, wherever its kernel is small, and soxr's elsewhere (16001 Hz).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import soxr
import torch
import torchaudio
from torchaudio.compliance import kaldi

from funasr_recipe.features.audio import load_audio
from funasr_recipe.features.fbank_conf import FbankConf, reduced, sinc_is_cheap, to_mono


@lru_cache(maxsize=32)
def _resampler(orig: int, new: int) -> torchaudio.transforms.Resample:
    # The sinc kernel costs more to build than to apply on a short clip: build one per rate pair.
    return torchaudio.transforms.Resample(orig, new)


def change_rate(wave: torch.Tensor, orig: int, new: int) -> torch.Tensor:
    """(rows, n) audio from ``orig`` to ``new`` Hz: torchaudio's sinc where its kernel is small, as funasr
    resamples at decoding time; soxr otherwise (length round(n * new / orig) rather than the ceil)."""
    if orig == new:
        return wave
    if sinc_is_cheap(orig, new):
        return _resampler(*reduced(orig, new))(wave)
    x = np.ascontiguousarray(wave.numpy().T)  # soxr takes (frames, channels)
    return torch.from_numpy(np.ascontiguousarray(soxr.resample(x, orig, new, quality="HQ").T))


def resample(wave: torch.Tensor, rate: int, target: int, speed: float = 1.0) -> torch.Tensor:
    """Resample (rows, n) audio to ``target`` Hz, changing speed (and pitch) by ``speed`` on the way.

    Speed perturbation as Kaldi's ``sox speed`` does it: the audio is treated as if recorded at
    ``rate * speed`` Hz. Where that is a whole number of Hz and the sinc kernel from it is small, one
    torchaudio resampling does both (torchaudio 2.9 has no ``sox_effects`` any more). Otherwise
    (11025 Hz at speed 0.9 is 9922.5 Hz; 16001 Hz has no common factor with 16000) two steps whose
    kernels stay small: to ``target`` Hz, then from ``round(target * speed)`` to ``target`` Hz.
    """
    orig = round(rate * speed)
    if abs(orig / rate - speed) <= 1e-6 and sinc_is_cheap(orig, target):
        return change_rate(wave, orig, target)
    x = change_rate(wave, rate, target)
    return x if speed == 1.0 else change_rate(x, round(target * speed), target)


@lru_cache(maxsize=64)
def _kernel(window_size: int, n_mels: int, fs: int, window: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Window function, mel matrix (bins, fft/2+1) and FFT size of ``kaldi.fbank``, built once."""
    padded = 1 << (window_size - 1).bit_length()
    win = kaldi._feature_window_function(window, window_size, 0.42, torch.device("cpu"), torch.float32)
    mel, _ = kaldi.get_mel_banks(n_mels, padded, float(fs), 20.0, 0.0, 100.0, -500.0, 1.0)
    mel = torch.nn.functional.pad(mel, (0, 1), mode="constant", value=0)  # Nyquist bin, as kaldi.fbank
    # Each row twice: (re, im) pairs of the spectrum squared, times this, sum to power @ mel in one mm.
    return win, mel.T.repeat_interleave(2, dim=0).contiguous().float(), padded


def kaldi_fbank(x: torch.Tensor, conf: FbankConf, frame_length: float) -> torch.Tensor:
    """``torchaudio.compliance.kaldi.fbank`` with WavFrontend's options (dither 0, energy_floor 0).

    The same arithmetic in the same order, except that the window and mel matrix are cached rather
    than rebuilt per call, and power is re^2 + im^2 summed inside the mel product rather than
    abs()^2: together about 2x faster on 3 s clips. tests/unit/features/test_fbank.py checks it against
    torchaudio, and tests/unit/features/test_compute_fbank.py against funasr's WavFrontend.
    """
    window_size = int(conf.fs * frame_length * 0.001)
    win, mel, padded = _kernel(window_size, conf.n_mels, conf.fs, conf.window)
    return log_mel(frame_signal(x[0], conf, window_size), win, mel, padded)


def frame_signal(wave: torch.Tensor, conf: FbankConf, window_size: int) -> torch.Tensor:
    """(frames, window_size) view of a 1-D signal, Kaldi's framing (``snip_edges`` as configured)."""
    shift = int(conf.fs * conf.frame_shift * 0.001)
    if conf.snip_edges:
        frames = 0 if wave.numel() < window_size else 1 + (wave.numel() - window_size) // shift
        return wave.as_strided((frames, window_size), (shift, 1))
    return kaldi._get_strided(wave, window_size, shift, False)


def log_mel(strided: torch.Tensor, win: torch.Tensor, mel: torch.Tensor, padded: int,
            clips: list[int] | None = None) -> torch.Tensor:
    """Log mel energies of (frames, window) samples; every step is per frame, so the frames of several
    clips stacked give each clip's own values. ``clips``: the number of frames of each clip stacked
    (default: one clip); the mel product is made per clip, because a BLAS may round a row of a matrix
    product differently with the number of rows (OpenBLAS's Zen kernels do)."""
    frames = strided - strided.mean(dim=1, keepdim=True)
    # Pre-emphasis x[i] - 0.97 x[i-1] (x[-1] = x[0]) as a product then a difference, in place: the
    # same two roundings as torchaudio's (a fused a - 0.97 b would differ by up to 4e-3 in log-mel).
    prev = torch.empty_like(frames)
    torch.mul(frames[:, :-1], 0.97, out=prev[:, 1:])
    torch.mul(frames[:, :1], 0.97, out=prev[:, :1])
    frames.sub_(prev).mul_(win)
    spec = torch.view_as_real(torch.fft.rfft(frames, n=padded)).reshape(frames.shape[0], -1).square_()
    parts = spec.split(clips) if clips else [spec]
    energies = torch.cat([torch.mm(part, mel) for part in parts]) if len(parts) > 1 else torch.mm(spec, mel)
    return energies.clamp_min_(torch.finfo(torch.float32).eps).log_()


class FbankExtractor:
    """fbank of ``WavFrontend`` with dither off: same window, mel bins, framing and scaling."""

    def __init__(self, conf: FbankConf) -> None:
        self.conf = conf

    def from_wave(self, wave: np.ndarray, rate: int, speed: float = 1.0) -> np.ndarray:
        """(frames, n_mels) float32 from (samples,) or (samples, channels) float audio in [-1, 1]."""
        x = resample(torch.from_numpy(to_mono(wave))[None], rate, self.conf.fs, speed)
        # WavFrontend scales to the int16 range and shortens the window for clips under 25 ms.
        x = x * (1 << 15)
        frame_length = min(self.conf.frame_length, x.shape[1] / self.conf.fs * 1000)
        with torch.no_grad():
            return kaldi_fbank(x, self.conf, frame_length).numpy()

    def from_waves(self, waves: list[tuple[np.ndarray, int]]) -> list[np.ndarray]:
        """``from_wave`` of several clips, (audio, rate) each, with one resampling call per rate and one
        fbank call for all: per-call overhead, not arithmetic, is most of a short clip's cost. Each
        clip's frames are computed exactly as alone (the zero padding of torchaudio's batch is the zero
        padding it adds anyway; rates that soxr resamples go clip by clip)."""
        conf = self.conf
        monos = [w.mean(axis=1) if w.ndim == 2 and w.shape[1] > 1 else w.reshape(len(w), -1)[:, 0]
                 for w, _ in waves]
        scaled: list[torch.Tensor | None] = [None] * len(waves)
        with torch.no_grad():
            for rate in {r for _, r in waves}:
                index = [i for i, (_, r) in enumerate(waves) if r == rate]
                if not sinc_is_cheap(rate, conf.fs):  # soxr: clip by clip, as from_wave, so its own values
                    for i in index:
                        mono = torch.from_numpy(np.ascontiguousarray(monos[i], dtype=np.float32))[None]
                        scaled[i] = resample(mono, rate, conf.fs)[0] * (1 << 15)
                    continue
                batch = torch.zeros(len(index), max(len(monos[i]) for i in index))
                for row, i in enumerate(index):
                    batch[row, : len(monos[i])] = torch.from_numpy(np.asarray(monos[i], dtype=np.float32))
                out = resample(batch, rate, conf.fs) * (1 << 15)
                g = math.gcd(rate, conf.fs)
                for row, i in enumerate(index):  # torchaudio's own output length, ceil(n * new / orig)
                    scaled[i] = out[row, : -(-len(monos[i]) * (conf.fs // g) // (rate // g))]
            window_size = int(conf.fs * conf.frame_length * 0.001)
            full = [i for i, x in enumerate(scaled) if x.numel() >= window_size]
            result: list[np.ndarray | None] = [None] * len(waves)
            for i in set(range(len(waves))) - set(full):  # under 25 ms: WavFrontend shortens the window
                result[i] = kaldi_fbank(scaled[i][None], conf, scaled[i].numel() / conf.fs * 1000).numpy()
            if full:
                win, mel, padded = _kernel(window_size, conf.n_mels, conf.fs, conf.window)
                strided = [frame_signal(scaled[i], conf, window_size) for i in full]
                feats = log_mel(torch.cat(strided), win, mel, padded, [len(s) for s in strided]).numpy()
                for i, part in zip(full, np.split(feats, np.cumsum([len(s) for s in strided])[:-1]),
                                   strict=True):
                    result[i] = part
        return result

    def from_file(self, source: str, speed: float = 1.0) -> np.ndarray:
        """fbank of an audio file or Kaldi pipe; raises ``features.audio.AudioError`` on bad audio."""
        wave, rate = load_audio(source)
        return self.from_wave(wave, rate, speed)
