"""Stage 1 on real recordings: parity with funasr's WavFrontend, shards, resumption, bad audio.

Builds small Kaldi sets in tmp_path from the bundled digit recordings (8 kHz), plus a 44.1 kHz
stereo copy and an all-zero clip, validates them with stage 0, then runs ``local.compute_fbank``.
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
from funasr.frontends.wav_frontend import load_cmvn

from funasr_recipe.data.feats_dataset import load_features
from funasr_recipe.data.line_index import load_index
from local import compute_fbank
from tests.helpers.stage1_data import CONFIG, N_DEV, N_TRAIN, frontend, jsonl, stage1


def test_features_after_lfr_cmvn_match_wavfrontend(dumped: Path) -> None:
    """Stage-1 fbank + on-the-fly LFR/CMVN equals WavFrontend on the same audio, resampled as funasr does."""
    fe = frontend(dumped / "train" / "am.mvn")
    worst = 0.0
    for item in jsonl(dumped / "dev" / "data.jsonl"):
        x, rate = sf.read(item["wav"], dtype="float32", always_2d=True)
        wave = torch.from_numpy(x.mean(axis=1))
        if rate != 16000:  # funasr's loader: torchaudio Resample to the frontend's rate
            wave = torchaudio.transforms.Resample(rate, 16000)(wave[None])[0]
        ref, ref_len = fe(wave[None], torch.tensor([wave.shape[0]]))
        ours = load_features(item["source"], fe)
        assert ours.shape == ref[0].shape and int(ref_len[0]) == ours.shape[0], item["key"]
        worst = max(worst, float((ours - ref[0]).abs().max()))
    assert worst < 1e-3, worst


def test_jsonl_points_at_features_with_frame_counts(dumped: Path) -> None:
    train = jsonl(dumped / "train" / "data.jsonl")
    dev = jsonl(dumped / "dev" / "data.jsonl")
    assert len(train) == 3 * N_TRAIN and len(dev) == N_DEV + 2  # train x3 speeds; dev never perturbed
    assert {i["speed"] for i in dev} == {1.0}
    by_key = {i["key"]: i for i in train}
    for item in train + dev:
        mat = np.asarray(__import__("kaldiio").load_mat(item["source"]))
        assert mat.shape == (item["source_len"], 80) and np.isfinite(mat).all()
        assert Path(item["source"].rsplit(":", 1)[0]).is_absolute()
    for key, item in by_key.items():
        if item["speed"] != 1.0:
            factor = item["speed"]
            assert key.startswith(f"sp{factor:g}-")
            base = by_key[key.split("-", 1)[1]]
            assert item["target"] == base["target"]
            assert abs(item["source_len"] - base["source_len"] / factor) <= 2, key  # faster = shorter
    # The merge leaves each final list's line index, current, for stage 2 to map.
    for listing in ("train/data.jsonl", "dev/data.jsonl", "train/raw.jsonl"):
        index = load_index(dumped / listing)
        assert index.path == dumped / f"{listing}.idx" and index.stale() is None
        assert index.source_len.tolist() == [i["source_len"] for i in jsonl(dumped / listing)]


def test_silent_audio_gives_finite_features(dumped: Path) -> None:
    item = next(i for i in jsonl(dumped / "dev" / "data.jsonl") if i["key"].endswith("zeros"))
    feats = load_features(item["source"], frontend(dumped / "train" / "am.mvn"))
    assert torch.isfinite(feats).all() and feats.shape[0] == -(-item["source_len"] // 6)


def test_am_mvn_is_the_global_lfr_statistics(dumped: Path) -> None:
    """am.mvn (read by funasr's own load_cmvn) holds -mean and 1/std of the LFR training frames."""
    cmvn = load_cmvn(str(dumped / "train" / "am.mvn")).numpy()
    assert (dumped / "train" / "am.lfr7x6.mvn").read_text() == (dumped / "train" / "am.mvn").read_text()
    fe = frontend(None)
    frames = torch.cat([load_features(i["source"], fe) for i in jsonl(dumped / "train" / "data.jsonl")])
    mean, std = frames.double().mean(0).numpy(), frames.double().std(0, unbiased=False).numpy()
    assert cmvn.shape == (2, 560)
    np.testing.assert_allclose(-cmvn[0], mean, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(1 / cmvn[1], std, rtol=1e-3, atol=1e-4)
    report = json.loads((dumped / "train" / "report.json").read_text())
    assert report["accepted"] == 3 * N_TRAIN and report["rejected"] == 0
    assert report["frames"] == sum(i["source_len"] for i in jsonl(dumped / "train" / "data.jsonl"))


def test_tokenizer_is_built_for_a_from_scratch_config(dumped: Path) -> None:
    info = json.loads((dumped / "tok" / "tokenizer.json").read_text())
    assert info["kind"] == "sensevoice" and info["vocab_size"] == 25055
    assert (dumped / "tok" / "chn_jpn_yue_eng_ko_spectok.bpe.model").is_file()


def test_two_ranks_give_the_same_output_as_one(corpus: Path, dumped: Path) -> None:
    assert stage1(corpus, dump="dump2", world=2) == 0
    one, two = jsonl(dumped / "train" / "data.jsonl"), jsonl(corpus / "dump2" / "train" / "data.jsonl")
    assert [i["key"] for i in one] == [i["key"] for i in two]
    kaldiio = __import__("kaldiio")
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(kaldiio.load_mat(a["source"]), kaldiio.load_mat(b["source"]))
    assert (dumped / "train" / "am.mvn").read_text() == (corpus / "dump2" / "train" / "am.mvn").read_text()


def test_rerun_skips_finished_shards_and_redoes_a_lost_one(corpus: Path, dumped: Path,
                                                           capfd: pytest.CaptureFixture) -> None:
    shards = sorted((dumped / "train" / "shards").glob("*.ark"))
    before = {p: p.stat().st_mtime_ns for p in shards}
    (dumped / "train" / "shards" / "00002.done").unlink()
    assert stage1(corpus) == 0
    after = {p: p.stat().st_mtime_ns for p in shards}
    redone = [p.name for p in shards if after[p] != before[p]]
    assert redone == ["00002.ark"]
    assert "dev: rank 0 of 1: 0 of its 1 shards to compute" in capfd.readouterr().err
    assert len(jsonl(dumped / "train" / "data.jsonl")) == 3 * N_TRAIN


def test_audio_lost_after_stage0_is_rejected_with_its_reason(corpus: Path, tmp_path: Path) -> None:
    """A wav deleted and one corrupted after stage 0: rejected, named, counted; strict mode stops."""
    root = tmp_path / "r"
    shutil.copytree(corpus / "data", root / "data")
    dev = jsonl(root / "data" / "dev" / "data.jsonl")
    gone, broken = Path(dev[0]["source"]), Path(dev[1]["source"])
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.move(gone, moved / gone.name)
    shutil.copy(broken, moved / broken.name)
    try:
        broken.write_bytes(b"RIFF\x00\x00garbage" * 10)
        assert stage1(root) == 0
        report = json.loads((root / "dump" / "dev" / "report.json").read_text())
        assert report["rejected_by_reason"] == {"missing_file": 1, "unreadable_audio": 1}
        assert report["accepted"] + report["rejected"] == N_DEV + 2
        rows = (root / "dump" / "dev" / "rejected.tsv").read_text().splitlines()[1:]
        got = {(r.split("\t")[1], r.split("\t")[2], r.split("\t")[3]) for r in rows}
        assert got == {("1", dev[0]["key"], "missing_file"), ("2", dev[1]["key"], "unreadable_audio")}
        assert all(r.split("\t")[0].endswith("data/dev/data.jsonl") for r in rows)
        assert stage1(root, "--strict", "true", dump="strict") == 2
    finally:
        shutil.move(moved / gone.name, gone)
        shutil.copy(moved / broken.name, broken)


def test_config_overrides_reach_the_features(corpus: Path, tmp_path: Path) -> None:
    """Hydra overrides given after -- change the frontend: 40 mel bins give 40-dim features."""
    common = ["--config", str(CONFIG), "--data-dir", str(corpus / "data"), "--dump-dir", str(tmp_path),
              "--sets", "dev", "--train-set", "train"]
    assert compute_fbank.main(["work", *common, "--", "++frontend_conf.n_mels=40"]) == 0
    item = jsonl(next(tmp_path.glob("dev/shards/*.jsonl")))[0]
    assert __import__("kaldiio").load_mat(item["source"]).shape[1] == 40
