"""Stage 1's augmentation of the training set (features/augment.py, the config's ``feats_augment``):
what each setting does to a clip, that a job's draw depends on its key alone, that the config's values are
checked, and that the plan, the shards and the report carry it while the other sets stay clean.

Writes tones in noise with soundfile and stage-0 data.jsonl lines (data/manifest.py's writer) under
pytest's tmp paths, then runs features/dump.py's plan/compute/merge on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import soundfile as sf

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.manifest import manifest_line
from funasr_recipe.features.audio import probe_audio
from funasr_recipe.features.augment import AugmentConf, Augmenter, simulate_rooms
from funasr_recipe.features.dump import compute_shards, merge_set, plan_sets
from funasr_recipe.features.fbank import FbankConf

TAGS = {"language": "<|en|>", "emotion": "<|NEUTRAL|>", "event": "<|Speech|>"}
RATE = 8000


def tone(seconds: float = 0.5, seed: int = 0) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * (300 + 40 * seed) * t)).astype(np.float32)


def snr_db(clean: np.ndarray, noisy: np.ndarray) -> float:
    return float(10 * np.log10((clean ** 2).sum() / ((noisy - clean) ** 2).sum()))


def test_each_setting_does_what_it_says_and_keeps_the_length() -> None:
    x = tone()
    same, done = Augmenter(AugmentConf(gain_db=(0.0, 0.0)))(x, RATE, "a")
    assert done == [] and np.array_equal(same, x)
    louder, _ = Augmenter(AugmentConf(gain_db=(6.0, 6.0)))(x, RATE, "a")
    np.testing.assert_allclose(louder, x * 10 ** (6 / 20), rtol=1e-6)
    for key in ("a", "b", "c"):
        noisy, done = Augmenter(AugmentConf(noise_prob=1.0, snr_db=(10.0, 10.0)))(x, RATE, key)
        assert done == ["noise"] and noisy.shape == x.shape
        assert snr_db(x, noisy) == pytest.approx(10.0, abs=0.01)
    wet, done = Augmenter(AugmentConf(reverb_prob=1.0, rt60_s=(0.2, 0.3)))(x, RATE, "a")
    assert done == ["reverb"] and wet.shape == x.shape and not np.allclose(wet, x, atol=1e-3)
    # The direct path is scaled to 1: a room changes the level by a few dB, not by orders of magnitude.
    assert 0.3 < np.sqrt((wet ** 2).mean() / (x ** 2).mean()) < 10


def test_a_job_draws_by_its_key_alone_and_silence_gets_no_noise() -> None:
    # Short rooms where the room is not the point: a bank of 0.6 s rooms takes seconds to simulate.
    conf = AugmentConf(reverb_prob=0.5, rt60_s=(0.2, 0.3), noise_prob=0.5, gain_db=(-10.0, 10.0), seed=3)
    x = tone()
    first, again = Augmenter(conf), Augmenter(conf)  # two processes: each its own room bank
    for key in ("sp0.9-u1", "u1", "u2"):
        a, done_a = first(x, RATE, key)
        b, done_b = again(x, RATE, key)
        assert np.array_equal(a, b) and done_a == done_b
    outcomes = {tuple(first(x, RATE, f"u{i}")[1]) for i in range(40)}
    assert outcomes == {(), ("reverb",), ("noise",), ("reverb", "noise")}  # independent draws, both ways
    other_seed = Augmenter(AugmentConf(reverb_prob=0.5, rt60_s=(0.2, 0.3), noise_prob=0.5,
                                       gain_db=(-10.0, 10.0), seed=4))
    assert any(not np.array_equal(first(x, RATE, f"u{i}")[0], other_seed(x, RATE, f"u{i}")[0])
               for i in range(5))
    silence, done = Augmenter(AugmentConf(noise_prob=1.0))(np.zeros(800, np.float32), RATE, "s")
    assert done == [] and not silence.any()


def test_rooms_have_the_reverberation_time_asked_for() -> None:
    import pyroomacoustics as pra

    for rir in simulate_rooms(16000, (0.3, 0.3), seed=0, n=3):
        assert np.abs(rir).max() == pytest.approx(1.0)
        # Sabine's formula is a model: the measured decay of a simulated shoebox lies near, not on, it.
        assert 0.2 < pra.experimental.measure_rt60(rir, fs=16000) < 0.6


@pytest.mark.parametrize(("spec", "message"), [
    ({"reverb_probb": 0.3}, r"feats_augment.reverb_probb: not a key of feats_augment; expected one of"),
    ({"noise_prob": 1.5}, r"feats_augment.noise_prob: 1.5 is not a probability in \[0, 1\]"),
    ({"snr_db": [20, 5]}, r"feats_augment.snr_db: \[20, 5\] is not a range \[lo, hi\] with lo <= hi"),
    ({"gain_db": 3}, r"feats_augment.gain_db: 3 is not a range"),
    ({"rt60_s": [0, 0.5]}, r"feats_augment.rt60_s: \[0.0, 0.5\] must be above 0 s"),
    ({"seed": 1.5}, r"feats_augment.seed: 1.5 is not an integer"),
    ("yes", r"feats_augment: expected a mapping of"),
])
def test_a_bad_setting_is_named(spec: object, message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        AugmentConf.from_config(spec)  # type: ignore[arg-type]


def write_set(root: Path, name: str, n: int) -> None:
    (root / "audio").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        path = root / "audio" / f"{name}{i}.wav"
        sf.write(path, tone(0.4, seed=i), RATE, subtype="PCM_16")
        lines.append(manifest_line(f"{name}{i}", str(path), probe_audio(str(path)), "ONE", TAGS, "<|woitn|>",
                                   "spk"))
    (root / "data" / name).mkdir(parents=True, exist_ok=True)
    (root / "data" / name / "data.jsonl").write_text("".join(lines), encoding="utf-8")


def feats(dump: Path, name: str) -> dict[str, np.ndarray]:
    return dict(kaldiio.load_scp(str(dump / name / "feats.scp")))


def test_only_the_training_set_is_augmented_and_the_shards_agree_however_cut(tmp_path: Path) -> None:
    write_set(tmp_path, "train", 6)
    write_set(tmp_path, "dev", 3)
    conf = FbankConf()
    augment = AugmentConf(reverb_prob=0.5, rt60_s=(0.2, 0.3), noise_prob=0.5, gain_db=(-6.0, 6.0))
    runs = {}
    for dump, shard_size, aug in (("off", 100, AugmentConf()), ("one", 100, augment), ("cut", 1, augment)):
        plans = plan_sets(tmp_path / "data", tmp_path / dump, ["dev", "train"], "train", "0.9 1.0",
                          shard_size, conf, augment=aug)
        compute_shards(plans, conf, 0, 1, strict=False)
        runs[dump] = [merge_set(plan, conf, 1, 10)[0] for plan in plans]
    off, one, cut = runs["off"], runs["one"], runs["cut"]
    assert one[1]["fingerprint"] != off[1]["fingerprint"] and one[0]["fingerprint"] == off[0]["fingerprint"]
    assert "augment" not in off[1] and "augment" not in one[0]  # the dev set and an unaugmented run
    assert one[1]["augment"]["reverb_prob"] == 0.5 and sum(one[1]["augmented"].values()) > 0
    assert one[1]["augmented"] == cut[1]["augmented"]
    report = json.loads((tmp_path / "one" / "train" / "report.json").read_text())
    assert report["augmented"] == one[1]["augmented"]
    for key, matrix in feats(tmp_path / "one", "train").items():  # by key, whichever shard computed it
        np.testing.assert_array_equal(matrix, feats(tmp_path / "cut", "train")[key])
    assert any(not np.array_equal(m, feats(tmp_path / "off", "train")[k])
               for k, m in feats(tmp_path / "one", "train").items())
    for key, matrix in feats(tmp_path / "one", "dev").items():
        np.testing.assert_array_equal(matrix, feats(tmp_path / "off", "dev")[key])


def test_an_augmentation_that_fails_rejects_that_job_only(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """One job's failure inside the augmentation is its ``feature_error`` rejection (file, line, key),
    as any failure of its fbank is; the other jobs are written."""
    write_set(tmp_path, "train", 3)
    original = Augmenter.__call__

    def fail_one(self: Augmenter, wave: np.ndarray, rate: int, key: str) -> tuple[np.ndarray, list[str]]:
        if key == "sp0.9-train1":
            raise RuntimeError("room simulation failed")
        return original(self, wave, rate, key)

    monkeypatch.setattr(Augmenter, "__call__", fail_one)
    conf = FbankConf()
    plans = plan_sets(tmp_path / "data", tmp_path / "dump", ["train"], "train", "0.9 1.0", 100, conf,
                      augment=AugmentConf(gain_db=(-6.0, 6.0)))
    compute_shards(plans, conf, 0, 1, strict=False)
    report = merge_set(plans[0], conf, 1, 10)[0]
    assert report["accepted"] == 5 and report["rejected_by_reason"] == {"feature_error": 1}
    rejected = (tmp_path / "dump" / "train" / "rejected.tsv").read_text().splitlines()[1:]
    assert len(rejected) == 1 and "data.jsonl\t2\tsp0.9-train1\tfeature_error" in rejected[0]
    assert "RuntimeError: room simulation failed" in rejected[0]
