"""Shared by the stage-1 tests: small real sets validated by stage 0, and stage 1 run on them.

Reads the bundled digit recordings; writes only under pytest's tmp paths.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio
from funasr.frontends.wav_frontend import WavFrontend

from funasr_recipe.data.validate import validate_set
from local import compute_fbank
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "conf" / "tiny_sensevoice.yaml"
N_TRAIN, N_DEV = 24, 6


def make_set(set_dir: Path, wavs: list[Path]) -> None:
    set_dir.mkdir(parents=True)
    keys = [f"spk-{w.stem}" for w in wavs]
    (set_dir / "wav.scp").write_text("".join(f"{k} {w}\n" for k, w in zip(keys, wavs, strict=True)))
    (set_dir / "text").write_text("".join(f"{k} WORD{i % 3}\n" for i, k in enumerate(keys)))
    validate_set(set_dir)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/{train,dev}: real 8 kHz digits, one 44.1 kHz stereo and one silent 16 kHz clip in dev."""
    root = tmp_path_factory.mktemp("stage1")
    wavs = sorted(DEFAULT_WAV_DIR.glob("*.wav"))[:: 2500 // (N_TRAIN + N_DEV)][: N_TRAIN + N_DEV]
    if len(wavs) < N_TRAIN + N_DEV:
        pytest.skip(f"{DEFAULT_WAV_DIR}: the bundled corpus is missing")
    audio = root / "audio"
    audio.mkdir()
    local = [Path(shutil.copy(w, audio / w.name)) for w in wavs]
    x, rate = sf.read(local[0], dtype="float32")
    y = torchaudio.functional.resample(torch.from_numpy(x), rate, 44100).numpy()
    sf.write(audio / "stereo44k.wav", np.stack([y, 0.5 * y], axis=1), 44100)
    sf.write(audio / "zeros.wav", np.zeros(8000, dtype=np.int16), 16000)
    make_set(root / "data" / "train", local[:N_TRAIN])
    make_set(root / "data" / "dev", local[N_TRAIN:] + [audio / "stereo44k.wav", audio / "zeros.wav"])
    return root


def stage1(root: Path, *extra: str, dump: str = "dump", rank: int | None = None, world: int = 1) -> int:
    common = ["--config", str(CONFIG), "--data-dir", str(root / "data"), "--dump-dir", str(root / dump),
              "--sets", "train dev", "--train-set", "train", "--speed-perturb", "0.9 1.0 1.1",
              "--shard-size", "10", "--world-size", str(world), *extra]
    ranks = range(world) if rank is None else [rank]
    for r in ranks:
        if rc := compute_fbank.main(["work", *common, "--rank", str(r)]):
            return rc
    return compute_fbank.main(["merge", *common, "--tokenizer-dir", str(root / dump / "tok")])


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="session")
def dumped(corpus: Path) -> Path:
    assert stage1(corpus) == 0
    return corpus / "dump"


def frontend(cmvn: Path | None) -> WavFrontend:
    return WavFrontend(cmvn_file=None if cmvn is None else str(cmvn), fs=16000, window="hamming", n_mels=80,
                       frame_length=25, frame_shift=10, lfr_m=7, lfr_n=6, dither=0.0)
