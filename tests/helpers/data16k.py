"""Eight bundled digit clips, one per speaker, at 16 kHz in a stage-0 data.jsonl (a module fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import soundfile as sf
import torch

from funasr_recipe.features.audio import load_audio
from funasr_recipe.features.fbank import resample
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.helpers.model_dirs import WORDS

N_UTTS = 8


@pytest.fixture(scope="module")
def data16k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stage-0 style data/<set>/data.jsonl of 8 digit clips (every speaker) written at 16 kHz."""
    wavs = sorted(DEFAULT_WAV_DIR.glob("*.wav"))[::250][:N_UTTS]
    if len(wavs) < N_UTTS:
        pytest.skip(f"{DEFAULT_WAV_DIR}: the bundled corpus is missing")
    root = tmp_path_factory.mktemp("data")
    (root / "dev").mkdir()
    lines = []
    for w in wavs:
        data, rate = load_audio(str(w))
        wave = resample(torch.from_numpy(data[:, 0])[None], rate, 16000)[0].numpy()
        out = root / "wav" / f"{w.stem}.wav"
        out.parent.mkdir(exist_ok=True)
        sf.write(out, wave, 16000)
        lines.append(json.dumps({"key": w.stem, "source": str(out), "source_len": len(wave) // 160,
                                 "target": WORDS[int(w.stem.split("_")[0])], "text_language": "<|en|>"}))
    (root / "dev" / "data.jsonl").write_text("\n".join(lines) + "\n")
    (root / "corpus.json").write_text(json.dumps({"corpus": "fsdd", "language": "en", "train_set": "dev",
                                                  "valid_set": "dev", "test_sets": ["dev"], "sets": ["dev"]}))
    (root / "dev" / "report.json").write_text(json.dumps({"accepted": N_UTTS, "rejected": 0, "hours": 0.001,
                                                          "duration_s": {"min": 0.2, "max": 1.0}}))
    return root / "dev" / "data.jsonl"
