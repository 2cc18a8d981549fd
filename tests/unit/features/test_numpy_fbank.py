"""The runtime's numpy frontend (features/numpy_fbank.py) against the torch one stage 1 trains with
(features/fbank.py, itself checked against torchaudio and funasr's WavFrontend in test_fbank.py).

The resampler is torchaudio's kernel and must give its samples to float32 rounding. The fbank's FFT
is float64 where torch's is float32, so log-mel values differ by rounding, within the tolerances
numpy_fbank.py states (the same ones stage 4's parity gate applies).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchaudio

from funasr_recipe.features.audio import load_audio
from funasr_recipe.features.fbank import FbankExtractor
from funasr_recipe.features.fbank_conf import FbankConf
from funasr_recipe.features.numpy_fbank import (
    P999_TOLERANCE,
    NumpyFbank,
    feature_difference,
    sinc_resample,
    window_function,
    within_tolerance,
)

ROOT = Path(__file__).resolve().parents[3]
DIGITS = sorted((ROOT / "corpora" / "free-spoken-digit-dataset" / "recordings").glob("*.wav"))
SPEECHOCEAN = ROOT.parent / "shared" / "data" / "speechocean762" / "WAVE"


def _compare(ours: list[np.ndarray], ref: list[np.ndarray]) -> tuple[float, float]:
    assert [a.shape for a in ours] == [b.shape for b in ref]
    return feature_difference(ours, ref)


def _signal(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    return {"noise": rng.standard_normal(n) * 0.1, "tone": 0.3 * np.sin(2 * np.pi * 440 * t),
            "zeros": np.zeros(n)}[kind].astype(np.float32)


@pytest.mark.parametrize(("orig", "new"), [(8000, 16000), (22050, 16000), (44100, 16000), (48000, 16000),
                                           (11025, 16000), (16000, 8000)])
def test_resampler_gives_torchaudios_samples(orig: int, new: int) -> None:
    wave = _signal("noise", 12345, orig)
    ref = torchaudio.functional.resample(torch.from_numpy(wave)[None], orig, new)[0].numpy()
    ours = sinc_resample([wave], orig, new)[0]
    assert ours.shape == ref.shape and ours.dtype == np.float32
    assert np.abs(ours - ref).max() < 1e-5


@pytest.mark.parametrize("rate", [16000, 8000, 22050, 44100, 16001])  # 16001: soxr, as in fbank.py
@pytest.mark.parametrize("kind", ["noise", "tone", "zeros"])
@pytest.mark.parametrize("samples", [50, 399, 400, 4321, 48000])  # under one window, one, several
def test_features_equal_the_training_frontends(rate: int, kind: str, samples: int) -> None:
    conf = FbankConf()
    wave = _signal(kind, samples, samples)
    if samples * conf.fs // rate < 2:
        pytest.skip("too short for any frame at 16 kHz")
    ref = FbankExtractor(conf).from_wave(wave, rate)
    ours = NumpyFbank(conf).from_wave(wave, rate)
    assert ours.dtype == np.float32 and np.isfinite(ours).all()
    p999, largest = _compare([ours], [ref])
    assert within_tolerance(p999, largest), (p999, largest)


@pytest.mark.parametrize("window", ["hamming", "hanning", "povey", "rectangular", "blackman"])
@pytest.mark.parametrize("snip_edges", [True, False])
def test_every_window_and_framing(window: str, snip_edges: bool) -> None:
    conf = FbankConf(window=window, snip_edges=snip_edges, n_mels=40)
    wave = _signal("noise", 12345, 3)
    p999, largest = _compare([NumpyFbank(conf).from_wave(wave, 16000)],
                             [FbankExtractor(conf).from_wave(wave, 16000)])
    assert within_tolerance(p999, largest), (p999, largest)


def test_an_unknown_window_is_named() -> None:
    with pytest.raises(ValueError, match="unknown fbank window 'kaiser'"):
        window_function("kaiser", 400)


def test_stereo_is_averaged_as_in_training() -> None:
    wave = np.stack([_signal("noise", 8000, 1), _signal("tone", 8000, 2)], axis=1)
    p999, largest = _compare([NumpyFbank(FbankConf()).from_wave(wave, 22050)],
                             [FbankExtractor(FbankConf()).from_wave(wave, 22050)])
    assert within_tolerance(p999, largest)


def test_batched_equals_one_clip_at_a_time() -> None:
    """The runtime's batches: each clip's frames exactly as alone, whatever its rate or length."""
    extractor = NumpyFbank(FbankConf(lfr_m=7, lfr_n=6))
    # Several lengths per rate: the clips of one rate are resampled in one product.
    clips = [(_signal("noise", n, n), r) for n, r in [(16000, 16000), (300, 16000), (9000, 8000), (3, 8000),
                                                       (12345, 8000), (44100, 44100), (1000, 44100),
                                                       (441, 44100), (5000, 16001), (7000, 16001)]]
    batched = extractor.from_waves(clips)
    for clip, feats in zip(clips, batched, strict=True):
        np.testing.assert_array_equal(feats, extractor.from_wave(*clip))


def _real_audio() -> list[tuple[np.ndarray, int]]:
    files = sorted(SPEECHOCEAN.rglob("*.WAV"))[:150] if SPEECHOCEAN.is_dir() else DIGITS[:150]
    return [load_audio(str(f)) for f in files]


def test_real_speech_within_rounding_of_the_training_features() -> None:
    """Real recordings (speechocean762 when ../shared is here, else the bundled digits) at their own rate
    and resampled to the rates users bring, as the service receives them."""
    waves = _real_audio()
    assert waves, "no audio found"
    conf = FbankConf()
    torch_side, numpy_side = FbankExtractor(conf), NumpyFbank(conf)
    for rate in (None, 44100):
        clips = [(w, r) if rate is None else (torch_side_rate(w, r, rate), rate) for w, r in waves]
        p999, largest = _compare([numpy_side.from_wave(*c) for c in clips],
                                 [torch_side.from_wave(*c) for c in clips])
        assert within_tolerance(p999, largest), (rate, p999, largest)


def torch_side_rate(wave: np.ndarray, rate: int, new: int) -> np.ndarray:
    """A recording as if it had been made at ``new`` Hz (torchaudio's resampler), mono float32."""
    mono = wave.mean(axis=1) if wave.ndim == 2 else wave
    return torchaudio.functional.resample(torch.from_numpy(np.ascontiguousarray(mono, np.float32))[None],
                                          rate, new)[0].numpy()


def test_a_wrong_frontend_is_far_outside_the_bounds() -> None:
    """The bounds above are tight enough to catch the mistakes they are for."""
    wave = _signal("noise", 16000, 5) + _signal("tone", 16000, 5)
    ref = FbankExtractor(FbankConf()).from_wave(wave, 16000)
    for wrong in (FbankConf(window="hanning"), FbankConf(window="povey")):
        p999, _ = _compare([NumpyFbank(wrong).from_wave(wave, 16000)], [ref])
        assert p999 > 50 * P999_TOLERANCE, (wrong, p999)
    resampled = NumpyFbank(FbankConf()).from_wave(torch_side_rate(wave, 16000, 15000), 16000)[: len(ref)]
    p999, _ = _compare([resampled], [ref[: len(resampled)]])
    assert p999 > 50 * P999_TOLERANCE


def test_building_the_frontend_leaves_numpys_blas_one_thread() -> None:
    """In a process of its own: the limit is process-wide by design (OpenBLAS has one setting)."""
    code = ("from threadpoolctl import threadpool_info\n"
            "from funasr_recipe.features.fbank_conf import FbankConf\n"
            "from funasr_recipe.features.numpy_fbank import NumpyFbank\n"
            "import numpy as np\n"
            "before = [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']\n"
            "NumpyFbank(FbankConf())\n"
            "after = [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']\n"
            "import json; print(json.dumps([before, after]))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env | {"OPENBLAS_NUM_THREADS": "2"},
                         capture_output=True, text=True, check=True, timeout=120).stdout
    before, after = json.loads(out)
    assert before and all(n == 2 for n in before) and after and all(n == 1 for n in after), out
