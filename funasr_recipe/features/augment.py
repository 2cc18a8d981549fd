"""Stage 1's waveform augmentation of the training set: simulated rooms, additive noise, gain.

The model config's recipe key ``feats_augment`` (funasr ignores it) turns it on; every job of the
training set (each speed copy of each utterance) draws, independently, whether it is reverberated,
whether noise is added and its gain. The features are computed once (stage 1), so a job's draw is fixed
for the run: it is seeded by ``seed`` and the job's key alone, so the same job gets the same audio
whichever process or shard computes it, and a resumed stage 1 agrees with an uninterrupted one.

  feats_augment:
    reverb_prob: 0.3          # share of jobs convolved with a simulated room's impulse response
    rt60_s: [0.2, 0.6]        # its reverberation time, uniform in this range
    noise_prob: 0.3           # share of jobs mixed with noise
    snr_db: [5, 25]           # at a signal-to-noise ratio uniform in this range
    gain_db: [-10, 10]        # every job's level changed by a gain uniform in this range
    seed: 0

Rooms are shoeboxes simulated by pyroomacoustics' image-source method (a bank of ``ROOMS`` per sample
rate, made once per process: one costs 0.03-0.5 s); the convolution and the mixing at a given SNR are
torchaudio's. The noise is Gaussian with a 1/f^beta spectrum, beta uniform in [0, 2] (white to brown):
no noise corpus is bundled, and a model trained on a few clean voices mostly needs to stop relying on
each recording's own background. Reads and writes nothing.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import astuple, dataclass, fields

import numpy as np

from funasr_recipe.core.rejections import BadInputError

ROOMS = 32  # the bank's size: plenty of rooms for a draw, few enough to simulate in seconds


@dataclass(frozen=True)
class AugmentConf:
    """``feats_augment`` of the config; all probabilities 0 and no gain range: off."""

    reverb_prob: float = 0.0
    rt60_s: tuple[float, float] = (0.2, 0.6)
    noise_prob: float = 0.0
    snr_db: tuple[float, float] = (5.0, 25.0)
    gain_db: tuple[float, float] = (0.0, 0.0)
    seed: int = 0

    @property
    def active(self) -> bool:
        return self.reverb_prob > 0 or self.noise_prob > 0 or self.gain_db != (0.0, 0.0)

    def fingerprint(self) -> str:
        pairs = zip(fields(self), astuple(self), strict=True)
        return "augment " + " ".join(f"{f.name}={v}" for f, v in pairs)

    @classmethod
    def from_config(cls, spec: dict | None, where: str = "feats_augment") -> AugmentConf:
        """The conf of a config's ``feats_augment`` mapping (None: off); BadInputError naming the key
        and the value for an unknown key, a probability outside [0, 1] or a range that is not [lo, hi]."""
        if spec is None:
            return cls()
        if not isinstance(spec, dict):
            raise BadInputError(f"{where}: expected a mapping of {', '.join(f.name for f in fields(cls))}, "
                                f"got {spec!r}")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(spec) - known):
            raise BadInputError(f"{where}.{unknown[0]}: not a key of feats_augment; expected one of "
                                f"{', '.join(sorted(known))}")
        values = {}
        for name, value in spec.items():
            if name.endswith("_prob"):
                if not isinstance(value, int | float) or not 0 <= value <= 1:
                    raise BadInputError(f"{where}.{name}: {value!r} is not a probability in [0, 1]")
                values[name] = float(value)
            elif name == "seed":
                if not isinstance(value, int) or isinstance(value, bool):
                    raise BadInputError(f"{where}.seed: {value!r} is not an integer")
                values[name] = value
            else:
                lo_hi = list(value) if isinstance(value, list | tuple) else None
                if (lo_hi is None or len(lo_hi) != 2 or not all(isinstance(v, int | float) for v in lo_hi)
                        or lo_hi[0] > lo_hi[1]):
                    raise BadInputError(f"{where}.{name}: {value!r} is not a range [lo, hi] with lo <= hi")
                values[name] = (float(lo_hi[0]), float(lo_hi[1]))
        conf = cls(**values)
        if conf.rt60_s[0] <= 0:
            raise BadInputError(f"{where}.rt60_s: {list(conf.rt60_s)} must be above 0 s")
        return conf


def job_rng(seed: int, key: str) -> np.random.Generator:
    """The generator of one job's draws: from the seed and the job's key, nothing else."""
    digest = hashlib.sha256(f"{seed}\n{key}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def simulate_rooms(rate: int, rt60_s: tuple[float, float], seed: int, n: int = ROOMS) -> list[np.ndarray]:
    """``n`` impulse responses at ``rate`` Hz of shoebox rooms (3-8 x 3-6 x 2.5-3.5 m) with reverberation
    times uniform in ``rt60_s``, source and microphone anywhere half a metre from the walls; each scaled
    so that its direct path (its largest tap) is 1, which keeps a clip's level."""
    import pyroomacoustics as pra

    rng = np.random.default_rng([seed, rate])
    rirs = []
    for _ in range(n):
        dims = rng.uniform([3.0, 3.0, 2.5], [8.0, 6.0, 3.5])
        absorption, max_order = pra.inverse_sabine(rng.uniform(*rt60_s), dims)
        room = pra.ShoeBox(dims, fs=rate, materials=pra.Material(absorption), max_order=max_order)
        room.add_source(rng.uniform(0.5, dims - 0.5))
        room.add_microphone(rng.uniform(0.5, dims - 0.5))
        room.compute_rir()
        rir = np.asarray(room.rir[0][0], dtype=np.float32)
        rirs.append(rir / np.abs(rir).max())
    return rirs


def coloured_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` samples of Gaussian noise whose power falls as 1/f^beta, beta uniform in [0, 2]."""
    beta = rng.uniform(0.0, 2.0)
    spectrum = rng.standard_normal(n // 2 + 1) + 1j * rng.standard_normal(n // 2 + 1)
    spectrum /= np.maximum(np.arange(n // 2 + 1), 1) ** (beta / 2)
    return np.fft.irfft(spectrum, n).astype(np.float32)


class Augmenter:
    """Applies a conf's draws to one job's mono audio; holds the room banks, one per sample rate."""

    def __init__(self, conf: AugmentConf) -> None:
        self.conf = conf
        self._rooms: dict[int, list[np.ndarray]] = {}

    def __call__(self, wave: np.ndarray, rate: int, key: str) -> tuple[np.ndarray, list[str]]:
        """(the augmented audio, what was done to it, e.g. ["reverb", "noise"]) for job ``key``; float32
        mono of the same length as ``wave``. Silence gets no noise: its SNR is undefined."""
        import torch  # here: stage 1's merge imports this module and needs no torch (2 s)
        import torchaudio.functional as AF

        conf, rng = self.conf, job_rng(self.conf.seed, key)
        # Every draw is made whatever the outcome, so one setting's change leaves the others' draws alone.
        reverb, room = rng.random() < conf.reverb_prob, int(rng.integers(ROOMS))
        noisy, snr = rng.random() < conf.noise_prob, rng.uniform(*conf.snr_db)
        gain = rng.uniform(*conf.gain_db)
        x = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))
        done = []
        if reverb:
            rir = torch.from_numpy(self._room(rate, room))
            x = AF.fftconvolve(x, rir)[: x.shape[0]]
            done.append("reverb")
        if noisy and float(x.square().mean()) > 0:
            noise = torch.from_numpy(coloured_noise(rng, x.shape[0]))
            x = AF.add_noise(x[None], noise[None], torch.tensor([snr], dtype=torch.float32))[0]
            done.append("noise")
        if gain:
            x = x * math.pow(10.0, gain / 20)
        return x.numpy(), done

    def _room(self, rate: int, index: int) -> np.ndarray:
        if rate not in self._rooms:
            self._rooms[rate] = simulate_rooms(rate, self.conf.rt60_s, self.conf.seed)
        return self._rooms[rate][index]


OFF = AugmentConf()  # the other sets' (and a config without feats_augment)
