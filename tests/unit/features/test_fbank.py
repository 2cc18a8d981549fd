"""The fbank kernel and LFR stacking against the libraries they stand in for."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torchaudio
from funasr.frontends.wav_frontend import apply_lfr
from torchaudio.compliance import kaldi

from funasr_recipe.features.cmvn import CmvnStats, lfr
from funasr_recipe.features.fbank import FbankConf, FbankExtractor, kaldi_fbank, resample
from funasr_recipe.model.config import fbank_conf, load_config, tokenizer_spec

ROOT = Path(__file__).resolve().parents[3]
CONF = FbankConf(lfr_m=7, lfr_n=6)


@pytest.mark.parametrize("samples", [160, 399, 400, 401, 1234, 16000, 48000])
@pytest.mark.parametrize("kind", ["noise", "zeros", "tone"])
def test_kernel_equals_torchaudio_kaldi_fbank(samples: int, kind: str) -> None:
    """Same frames, same values (float32 rounding only), including clips shorter than one window."""
    gen = torch.Generator().manual_seed(samples)
    t = torch.arange(samples) / 16000
    x = {"noise": torch.randn(samples, generator=gen) * 3000, "zeros": torch.zeros(samples),
         "tone": 8000 * torch.sin(2 * torch.pi * 440 * t)}[kind][None].float()
    frame_length = min(25.0, samples / 16)  # as WavFrontend shortens it for short clips
    ref = kaldi.fbank(x, num_mel_bins=80, frame_length=frame_length, frame_shift=10, dither=0.0,
                      energy_floor=0.0, window_type="hamming", sample_frequency=16000)
    ours = kaldi_fbank(x, CONF, frame_length)
    assert ours.shape == ref.shape
    assert torch.isfinite(ours).all()
    assert (ours - ref).abs().max() < 1e-3


@pytest.mark.parametrize("window", ["hamming", "hanning", "povey", "rectangular", "blackman"])
@pytest.mark.parametrize("snip_edges", [True, False])
def test_private_torchaudio_helpers_still_behave(window: str, snip_edges: bool) -> None:
    """features/fbank.py borrows torchaudio's private ``_feature_window_function`` (every window) and
    ``_get_strided`` (snip_edges false) for its speed: pinned against the public ``kaldi.fbank``, so a
    torchaudio release that changes them fails here, not in a model's accuracy."""
    x = (torch.randn(1, 12345, generator=torch.Generator().manual_seed(7)) * 3000).float()
    conf = FbankConf(window=window, snip_edges=snip_edges, n_mels=40)
    ref = kaldi.fbank(x, num_mel_bins=40, frame_length=25.0, frame_shift=10, dither=0.0, energy_floor=0.0,
                      window_type=window, sample_frequency=16000, snip_edges=snip_edges)
    ours = kaldi_fbank(x, conf, 25.0)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max() < 1e-4


@pytest.mark.parametrize("m,n", [(7, 6), (5, 3), (3, 1), (4, 2), (1, 1)])
def test_lfr_equals_funasr_apply_lfr_on_every_length(m: int, n: int) -> None:
    rng = np.random.default_rng(0)
    for frames in range(1, 60):
        x = rng.standard_normal((frames, 3)).astype(np.float32)
        np.testing.assert_array_equal(lfr(x, m, n), apply_lfr(torch.from_numpy(x.copy()), m, n).numpy())


def test_speed_perturbation_scales_length_and_keeps_rate() -> None:
    x = torch.randn(1, 8000)
    assert resample(x, 8000, 16000, 1.0).shape[1] == 16000
    assert abs(resample(x, 8000, 16000, 1.1).shape[1] - 16000 / 1.1) <= 1
    assert abs(resample(x, 16000, 16000, 0.9).shape[1] - 8000 / 0.9) <= 1
    assert resample(x, 16000, 16000, 1.0) is x


@pytest.mark.parametrize("rate,speed", [(8000, 1.0), (8000, 0.9), (8000, 1.1), (16000, 0.9), (16000, 1.1),
                                        (11025, 1.0), (22050, 1.0), (44100, 1.0), (48000, 1.0), (48000, 0.9)])
def test_small_rate_ratios_keep_torchaudio_resampling_exactly(rate: int, speed: float) -> None:
    """Where the reduced ratio is small, one torchaudio resampling as before (and as funasr's loader does):
    features already dumped and the WavFrontend parity stay bit for bit."""
    x = torch.randn(1, rate, generator=torch.Generator().manual_seed(rate))
    orig = round(rate * speed)
    g = math.gcd(orig, 16000)
    ref = torchaudio.transforms.Resample(orig // g, 16000 // g)(x)
    assert torch.equal(resample(x, rate, 16000, speed), ref)


def test_stereo_is_averaged_before_fbank() -> None:
    ex = FbankExtractor(CONF)
    rng = np.random.default_rng(1)
    left, right = (rng.uniform(-0.5, 0.5, 8000).astype(np.float32) for _ in range(2))
    both = ex.from_wave(np.stack([left, right], axis=1), 16000)
    np.testing.assert_allclose(both, ex.from_wave((left + right) / 2, 16000), atol=1e-4)


@pytest.mark.parametrize("m,n", [(7, 6), (5, 3), (1, 1)])
def test_lfr_statistics_without_stacking_equal_stacked_ones(m: int, n: int) -> None:
    rng = np.random.default_rng(3)
    for frames in (1, 2, 6, 7, 13, 101):
        x = rng.standard_normal((frames, 4)).astype(np.float32) * 5
        stacked, direct = CmvnStats(), CmvnStats()
        stacked.add(lfr(x, m, n))
        direct.add_lfr(x, m, n)
        assert stacked.count == direct.count
        np.testing.assert_allclose(direct.sum, stacked.sum, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(direct.sumsq, stacked.sumsq, rtol=1e-9, atol=1e-9)


def test_cmvn_stats_merge_equals_one_pass() -> None:
    rng = np.random.default_rng(2)
    parts = [rng.standard_normal((n, 4)) * 3 + 1 for n in (5, 17, 1)]
    one, merged = CmvnStats(), CmvnStats()
    for p in parts:
        one.add(p)
        s = CmvnStats()
        s.add(p)
        merged.merge(s)
    merged.merge(CmvnStats())  # an empty shard (all rejected) changes nothing
    np.testing.assert_allclose(one.mean_std()[0], merged.mean_std()[0])
    np.testing.assert_allclose(merged.mean_std()[1], np.concatenate(parts).std(axis=0), rtol=1e-9)


def test_config_gives_frontend_and_tokenizer() -> None:
    cfg = load_config(ROOT / "conf" / "tiny_sensevoice.yaml", ["++frontend_conf.n_mels=64"])
    assert fbank_conf(cfg) == FbankConf(n_mels=64, lfr_m=7, lfr_n=6)
    assert tokenizer_spec(cfg)["kind"] == "sensevoice"
    cfg = load_config(ROOT / "conf" / "tiny_sensevoice.yaml", ["++pretrained_model=iic/SenseVoiceSmall"])
    assert tokenizer_spec(cfg) is None  # a pretrained model brings its own tokenizer
    with pytest.raises(ValueError, match="WavFrontend only"):
        fbank_conf(load_config(ROOT / "conf" / "tiny_sensevoice.yaml", ["frontend=WhisperFrontend"]))
