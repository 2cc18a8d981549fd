"""Stage 1 on input that used to stop it or slip through: odd sample rates and speeds, a 1-sample clip,
keys written twice, transcripts longer than CTC can align to their audio (issue #15).

Writes real audio with soundfile and stage-0 data.jsonl lines (data/manifest.py's own writer) under
pytest's tmp paths, then runs ``local.compute_fbank`` or features/dump.py's plan/compute/merge on them.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from funasr.frontends.wav_frontend import apply_lfr
from funasr.models.transformer.utils import subsampling
from omegaconf import OmegaConf

from funasr_recipe.data.manifest import manifest_line
from funasr_recipe.features.audio import probe_audio
from funasr_recipe.features.dump import compute_shards, merge_set, plan_sets
from funasr_recipe.features.fbank import FbankConf, FbankExtractor, resample
from funasr_recipe.features.targets import CtcFrames, ctc_frames, ctc_min_frames, output_frames
from funasr_recipe.model.config import funasr_config, load_config
from local import compute_fbank
from tests.helpers.stage1_data import CONFIG, ROOT, jsonl

TAGS = {"language": "<|en|>", "emotion": "<|NEUTRAL|>", "event": "<|Speech|>"}
WORDS = ["ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE"]


def clip(path: Path, seconds: float, rate: int = 16000, seed: int = 0) -> Path:
    """A tone in noise, or ``seconds`` 0: a single sample."""
    n = max(1, round(seconds * rate))
    t = np.arange(n) / rate
    noise = np.random.default_rng(seed).standard_normal(n)
    x = 0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + 0.05 * noise
    sf.write(path, x.astype(np.float32), rate, subtype="PCM_16")
    return path


def write_set(set_dir: Path, utts: list[tuple[str, Path, str]]) -> Path:
    """data.jsonl of (key, audio, transcript), as stage 0 writes it."""
    set_dir.mkdir(parents=True, exist_ok=True)
    lines = [manifest_line(key, str(audio), probe_audio(str(audio)), text, TAGS, "<|woitn|>", "spk")
             for key, audio, text in utts]
    (set_dir / "data.jsonl").write_text("".join(lines), encoding="utf-8")
    return set_dir / "data.jsonl"


def stage1(root: Path, *extra: str, config: Path = CONFIG, sets: str = "train", speed: str = "1.0",
           dump: str = "dump", merge: tuple[str, ...] = ()) -> int:
    common = ["--config", str(config), "--data-dir", str(root / "data"), "--dump-dir", str(root / dump),
              "--sets", sets, "--train-set", "train", "--speed-perturb", speed, "--shard-size", "4", *extra]
    if rc := compute_fbank.main(["work", *common]):
        return rc
    return compute_fbank.main(["merge", *common, "--tokenizer-dir", str(root / dump / "tok"), *merge])


def rows(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]


def normal_utts(audio: Path, n: int = 4) -> list[tuple[str, Path, str]]:
    return [(f"spk-{i}", clip(audio / f"n{i}.wav", 1.0, seed=i), f"{WORDS[i]} {WORDS[i + 1]}")
            for i in range(n)]


def speed_keys(keys: list[str]) -> list[str]:
    return sorted(f"{prefix}{k}" for k in keys for prefix in ("sp0.9-", "", "sp1.1-"))


# 1. Resampling whose cost does not explode with the rates' gcd.

@pytest.mark.parametrize("rate,speed", [(11025, 0.9), (11025, 1.1), (16001, 1.0), (44101, 1.0), (16001, 1.1),
                                        (44100, 0.9), (8000, 0.9), (22050, 1.0)])
def test_any_rate_and_speed_resamples_to_the_expected_length(rate: int, speed: float) -> None:
    x = torch.from_numpy(np.random.default_rng(rate).standard_normal((1, rate)).astype(np.float32))
    y = resample(x, rate, 16000, speed)
    assert y.dtype == torch.float32 and y.shape[0] == 1 and torch.isfinite(y).all()
    assert abs(y.shape[1] - rate * 16000 / rate / speed) <= 1, y.shape


def test_odd_rates_resample_without_a_huge_kernel() -> None:
    """16001 and 44101 Hz have no common factor with 16000: torchaudio's kernel for them took 5-9 GB. In a
    fresh process, with its data segment capped 1 GB above its start, so that a relapse fails here
    rather than taking the machine's memory."""
    script = textwrap.dedent("""
        import re, resource, time
        import numpy as np
        from funasr_recipe.features.fbank import FbankConf, FbankExtractor
        ex = FbankExtractor(FbankConf())
        ex.from_wave(np.zeros(16000, np.float32), 16000)
        vm = int(re.search(r"VmData:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        resource.setrlimit(resource.RLIMIT_DATA, (vm + (1 << 30), hard))
        before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
        for rate in (16001, 44101):
            for speed in (1.0, 0.9):
                x = np.random.default_rng(rate).uniform(-0.5, 0.5, rate).astype(np.float32)
                assert ex.from_wave(x, rate, speed).shape[0] > 90
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(f"{grew:.0f} MB {time.perf_counter() - start:.2f} s")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    grew, _, seconds, _ = proc.stdout.split()
    assert float(grew) < 200 and float(seconds) < 10, proc.stdout


def test_batched_fbank_takes_the_same_path_at_odd_rates() -> None:
    rng = np.random.default_rng(5)
    waves = [(rng.uniform(-0.3, 0.3, (n, c)).astype(np.float32), r)
             for n, c, r in ((16001, 1, 16001), (8000, 2, 16001), (11025, 1, 11025), (44101, 1, 44101),
                             (300, 1, 16001), (8000, 1, 8000))]
    ex = FbankExtractor(FbankConf())
    for got, wave in zip(ex.from_waves(waves), waves, strict=True):
        assert np.array_equal(got, ex.from_wave(*wave)), wave[1]


def test_stage1_speed_perturbs_11025_hz_audio(tmp_path: Path) -> None:
    audio = tmp_path / "audio"
    audio.mkdir()
    write_set(tmp_path / "data" / "train", [(f"u{i}", clip(audio / f"{i}.wav", 1.0, 11025, i), WORDS[i])
                                            for i in range(3)])
    assert stage1(tmp_path, speed="0.9 1.0 1.1") == 0
    items = jsonl(tmp_path / "dump" / "train" / "data.jsonl")
    assert sorted(i["key"] for i in items) == speed_keys(["u0", "u1", "u2"])
    frames = {i["key"]: i["source_len"] for i in items}
    assert abs(frames["sp0.9-u0"] - frames["u0"] / 0.9) <= 2
    assert abs(frames["sp1.1-u0"] - frames["u0"] / 1.1) <= 2


# 2. Any failure of one utterance is that utterance's rejection.

def test_a_one_sample_clip_is_a_feature_error_not_a_crash(tmp_path: Path) -> None:
    audio = tmp_path / "audio"
    audio.mkdir()
    one = clip(audio / "one.wav", 0)
    jsonl_path = write_set(tmp_path / "data" / "train", [*normal_utts(audio, 2), ("spk-one", one, "ONE")])
    assert stage1(tmp_path) == 0
    report = json.loads((tmp_path / "dump" / "train" / "report.json").read_text())
    assert report["rejected_by_reason"] == {"feature_error": 1} and report["accepted"] == 2
    (row,) = rows(tmp_path / "dump" / "train" / "rejected.tsv")
    assert row[:4] == [str(jsonl_path), "3", "spk-one", "feature_error"]
    assert row[4].startswith("AssertionError: ") and row[4].endswith(f"({one})")
    assert stage1(tmp_path, "--strict", "true", dump="strict") == 2


# 3. Every key stage 1 writes is unique.

def test_a_speed_factor_given_twice_is_refused(tmp_path: Path) -> None:
    write_set(tmp_path / "data" / "train", normal_utts(tmp_path, 1))
    for twice in ("0.9 1.0 1.0", "1 1.0", "0.9 0.9000001"):
        with pytest.raises(ValueError, match="is given more than once"):
            plan_sets(tmp_path / "data", tmp_path / "dump", ["train"], "train", twice, 10, FbankConf())


def _clashing_set(root: Path) -> Path:
    """Key X next to a user key sp0.9-X: at speed 0.9, X becomes sp0.9-X too."""
    audio = root / "audio"
    audio.mkdir()
    return write_set(root / "data" / "train", [("X", clip(audio / "x.wav", 1.0), "ONE"),
                                               ("sp0.9-X", clip(audio / "y.wav", 1.0, seed=1), "TWO")])


def test_a_key_written_twice_in_one_shard_stops_it_naming_both_lines(tmp_path: Path) -> None:
    data = _clashing_set(tmp_path)
    plans = plan_sets(tmp_path / "data", tmp_path / "dump", ["train"], "train", "0.9 1.0", 10, FbankConf())
    with pytest.raises(ValueError, match="key 'sp0.9-X' is written twice") as e:
        compute_shards(plans, FbankConf(), 0, 1, strict=False)
    assert f"{data}:1 (key 'X' at speed 0.9)" in str(e.value)
    assert f"{data}:2 (key 'sp0.9-X' at speed 1)" in str(e.value)


def test_a_key_written_by_two_shards_stops_the_merge_naming_both_lines(tmp_path: Path) -> None:
    data = _clashing_set(tmp_path)
    plans = plan_sets(tmp_path / "data", tmp_path / "dump", ["train"], "train", "0.9 1.0", 1, FbankConf())
    compute_shards(plans, FbankConf(), 0, 1, strict=False)  # one job a shard: the two are apart
    with pytest.raises(ValueError, match="key 'sp0.9-X' is written twice") as e:
        merge_set(plans[0], FbankConf(), 1, 10)
    assert f"{data}:1 (key 'X' at speed 0.9)" in str(e.value)
    assert f"{data}:2 (key 'sp0.9-X' at speed 1)" in str(e.value)
    out = tmp_path / "dump" / "train"
    assert not list(out.glob("*.jsonl*")) and not list(out.glob("feats.scp*"))


# 4. Targets CTC cannot align are rejected in the merge.

def _long_transcript_sets(root: Path) -> tuple[Path, Path]:
    audio = root / "audio"
    audio.mkdir()
    long_text = " ".join(WORDS[i % 10] for i in range(100))
    train = write_set(root / "data" / "train",
                      [*normal_utts(audio), ("spk-long", clip(audio / "l.wav", 0.5), long_text)])
    dev = write_set(root / "data" / "dev", [("dev-ok", clip(audio / "d.wav", 1.0, seed=7), "SEVEN EIGHT"),
                                            ("dev-long", clip(audio / "dl.wav", 0.5, seed=8), long_text)])
    return train, dev


def test_a_long_transcript_on_a_short_clip_is_rejected_in_the_merge(tmp_path: Path) -> None:
    train, dev = _long_transcript_sets(tmp_path)
    assert stage1(tmp_path, sets="train dev", speed="0.9 1.0 1.1") == 0
    out = tmp_path / "dump"
    report = json.loads((out / "train" / "report.json").read_text())
    assert report["rejected_by_reason"] == {"target_too_long_for_audio": 3} and report["accepted"] == 12
    assert report["accepted"] + report["rejected"] == report["jobs"]
    items = jsonl(out / "train" / "data.jsonl")
    assert sorted(i["key"] for i in items) == speed_keys([f"spk-{i}" for i in range(4)])
    assert report["frames"] == sum(i["source_len"] for i in items)
    scp = (out / "train" / "feats.scp").read_text().splitlines()
    assert [line.split()[0] for line in scp] == [i["key"] for i in items]
    rejected = rows(out / "train" / "rejected.tsv")
    reason = "target_too_long_for_audio"
    assert sorted(r[:4] for r in rejected) == [[str(train), "5", k, reason] for k in speed_keys(["spk-long"])]
    assert all("100 tokens" in r[4] and "model output frames" in r[4] for r in rejected)
    assert [i["key"] for i in jsonl(out / "dev" / "data.jsonl")] == ["dev-ok"]
    assert [r[:4] for r in rows(out / "dev" / "rejected.tsv")] == [[str(dev), "2", "dev-long", reason]]
    assert stage1(tmp_path, "--strict", "true", dump="strict") == 2


def test_a_fine_tune_checks_with_the_pretrained_tokenizer(tmp_path: Path,
                                                          capfd: pytest.CaptureFixture) -> None:
    """The model dir's tokenizer, found as funasr finds it (configuration.json); without the dir, a
    warning."""
    _long_transcript_sets(tmp_path)
    assert stage1(tmp_path) == 0  # from scratch: builds the tokenizer the fake pretrained model gets
    model = tmp_path / "pretrained"
    model.mkdir()
    bpe = "chn_jpn_yue_eng_ko_spectok.bpe.model"
    (model / bpe).write_bytes((tmp_path / "dump" / "tok" / bpe).read_bytes())
    (model / "model.pt").write_bytes(b"")
    ours = OmegaConf.load(CONFIG)
    released = OmegaConf.merge(ours, {"tokenizer_conf": {"bpemodel": bpe}})
    OmegaConf.save(released, model / "config.yaml")
    (model / "configuration.json").write_text(json.dumps({"framework": "pytorch", "file_path_metas": {
        "init_param": "model.pt", "config": "config.yaml", "tokenizer_conf": {"bpemodel": bpe}}}))
    for key in ("build_tokenizer", "model_conf", "encoder_conf"):  # as conf/sensevoice_small.yaml
        ours.pop(key)
    ours.pretrained_model = "iic/SenseVoiceSmall"
    finetune = tmp_path / "finetune.yaml"
    OmegaConf.save(ours, finetune)
    capfd.readouterr()
    assert stage1(tmp_path, config=finetune, dump="ft0") == 0
    assert "WARNING" in (err := capfd.readouterr().err) and "target-length check skipped" in err
    assert "spk-long" in {i["key"] for i in jsonl(tmp_path / "ft0" / "train" / "data.jsonl")}
    assert stage1(tmp_path, config=finetune, dump="ft", merge=("--pretrained-dir", str(model))) == 0
    report = json.loads((tmp_path / "ft" / "train" / "report.json").read_text())
    assert report["rejected_by_reason"] == {"target_too_long_for_audio": 1}


@pytest.mark.parametrize("layer,cls", [("conv2d", "Conv2dSubsampling"), ("conv2d2", "Conv2dSubsampling2"),
                                       ("conv2d6", "Conv2dSubsampling6"), ("conv2d8", "Conv2dSubsampling8"),
                                       ("conv2dpad", "Conv2dSubsamplingPad")])
def test_output_frames_are_funasr_subsampling_lengths(layer: str, cls: str) -> None:
    sub = getattr(subsampling, cls)(40, 4, 0.0).eval()
    for t in range(1, 50):
        try:
            _, mask = sub(torch.zeros(1, t, 40), torch.ones(1, 1, t, dtype=torch.bool))
        except RuntimeError:  # shorter than the kernels: funasr cannot run it, so no target fits
            assert output_frames(t, 1, layer) == 0, t
            continue
        assert output_frames(t, 1, layer) == int(mask.sum()), t


def test_output_frames_after_lfr_are_funasr_apply_lfr_lengths() -> None:
    for t in range(1, 40):
        lfr = apply_lfr(torch.zeros(t, 2), 7, 6).shape[0]
        assert output_frames(t, 6, "pe") == output_frames(t, 6, None) == lfr, t


def test_ctc_min_frames_is_where_torch_ctc_loss_turns_finite() -> None:
    rng = random.Random(0)
    for _ in range(40):
        ids = [rng.randint(1, 3) for _ in range(rng.randint(1, 8))]
        need = ctc_min_frames(ids)
        assert need == len(ids) + sum(a == b for a, b in zip(ids, ids[1:], strict=False))
        for t in (need, need - 1):
            if t == 0:
                continue
            logp = torch.zeros(t, 1, 4).log_softmax(-1)
            loss = torch.nn.functional.ctc_loss(logp, torch.tensor([ids]), torch.tensor([t]),
                                                torch.tensor([len(ids)]), reduction="sum")
            assert bool(torch.isfinite(loss)) == (t >= need), (ids, t)
    assert ctc_min_frames([]) == 0 and ctc_min_frames([5, 5, 5]) == 5 and ctc_min_frames([1, 2, 1]) == 3
    assert CtcFrames(6, None).problem([1, 2, 2], 13) == (
        "3 tokens and 1 repeats need 4 CTC frames; the audio gives 3 model output frames (13 fbank frames, "
        "LFR n=6, input layer None)")
    assert CtcFrames(6, None).problem([1, 2, 2], 19) is None


def test_ctc_frames_follow_the_model_config() -> None:
    def of(name: str, *overrides: str) -> CtcFrames | None:
        cfg = funasr_config(load_config(ROOT / "conf" / name, list(overrides)))
        return ctc_frames(cfg, FbankConf.from_frontend_conf(cfg["frontend_conf"]).lfr_n)

    assert of("tiny_sensevoice.yaml") == CtcFrames(6, None)  # SenseVoiceEncoderSmall ignores its input_layer
    assert of("tiny_conformer_ctc.yaml") == CtcFrames(1, "conv2d")
    assert of("tiny_conformer_ctc.yaml", "~encoder_conf.input_layer") == CtcFrames(1, "conv2d")  # the default
    assert of("tiny_conformer_ctc.yaml", "++encoder_conf.input_layer=conv2d6") == CtcFrames(1, "conv2d6")
    assert of("tiny_paraformer.yaml") == CtcFrames(6, "pe")  # ctc_weight 0.3
    assert of("tiny_paraformer.yaml", "++model_conf.ctc_weight=0.0") is None
