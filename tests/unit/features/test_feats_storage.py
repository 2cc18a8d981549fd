"""Stage 1's half-size storage (features/storage.py, the config's ``feats_storage: uint16``): the codec
against kaldiio's own reader, the shards stage 1 writes with it, CMVN taken from what is read back, the
fingerprint that makes a change of storage recompute the shards, and the refusal of an unknown value.

Reads the bundled digit recordings (tests/helpers/stage1_data.py); writes under pytest's tmp paths.
"""

from __future__ import annotations

import json
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.feats_batch import ArkReader
from funasr_recipe.features.cmvn import CmvnStats
from funasr_recipe.features.dump import plan_sets
from funasr_recipe.features.fbank_conf import FbankConf
from funasr_recipe.features.storage import HEADER_BYTES, check_storage, matrix_bytes, stored
from local import compute_fbank
from tests.helpers.stage1_data import CONFIG, jsonl


def matrices() -> dict[str, np.ndarray]:
    """Log-mel-like matrices, and the corner cases of the header: constant (range 1 + |min|), one row."""
    rng = np.random.default_rng(0)
    mats = {f"speech{t}": rng.normal(8.0, 4.0, (t, 80)).astype(np.float32) for t in (1, 2, 41, 997)}
    mats |= {"wide": (rng.standard_normal((50, 80)) * 1e4).astype(np.float32),
             "constant": np.full((9, 80), 2.5, np.float32), "negative": np.full((3, 4), -7.25, np.float32),
             "zeros": np.zeros((2, 80), np.float32)}
    return mats


@pytest.mark.parametrize("storage", ["float32", "uint16"])
def test_stored_is_what_kaldiio_and_the_reader_read_back(tmp_path: Path, storage: str) -> None:
    """``stored`` (what stage 1 takes CMVN from) and ArkReader's decoding are kaldiio's to the bit."""
    mats = matrices()
    ark, scp = tmp_path / "a.ark", tmp_path / "a.scp"
    method = {"float32": None, "uint16": 3}[storage]
    with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}", compression_method=method) as writer:
        for key, mat in mats.items():
            writer(key, mat)
    reader = ArkReader()
    for key, source in (line.split() for line in scp.read_text().splitlines()):
        want = kaldiio.load_mat(source)
        assert want.dtype == np.float32
        assert np.array_equal(stored(mats[key], storage), want), key
        for hint in (0, mats[key].shape[0], 10_000):  # the header decides, whatever the hint
            got = reader.read(source, hint, mats[key].shape[1])
            assert got.dtype == np.float32 and np.array_equal(got, want), (key, hint)
        # Half a level of the matrix's own range (kaldiio rounds with + 0.499: 0.501 of one), plus float32's
        # rounding of the values: the error does not grow with the value.
        span = float(mats[key].max() - mats[key].min()) or 1.0 + abs(float(mats[key].min()))
        bound = 0.501 * span / 65535 + 4 * float(np.spacing(np.abs(mats[key]).max()))
        assert np.abs(want - mats[key]).max() <= (bound if storage == "uint16" else 0), key
    keys = len("".join(f"{k} " for k in mats))
    assert ark.stat().st_size == keys + sum(matrix_bytes(storage, *m.shape) for m in mats.values())


def test_the_cm2_fast_path_needs_no_kaldiio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CM2 matrix is decoded by the reader itself (kaldiio's reader allocates three arrays a matrix)."""
    mat = matrices()["speech41"]
    kaldiio.save_ark(str(tmp_path / "a.ark"), {"u": mat}, scp=str(tmp_path / "a.scp"), compression_method=3)
    source = (tmp_path / "a.scp").read_text().split()[1]
    want = kaldiio.load_mat(source)
    monkeypatch.setattr("funasr_recipe.data.feats_batch.kaldiio.load_mat", lambda s: pytest.fail("kaldiio"))
    assert np.array_equal(ArkReader().read(source, 41, 80), want)
    cut = tmp_path / "cut.ark"
    offset = int(source.rsplit(":", 1)[1])
    for size in (offset + HEADER_BYTES["uint16"] - 3, offset + HEADER_BYTES["uint16"] + 100):
        cut.write_bytes((tmp_path / "a.ark").read_bytes()[:size])
        with pytest.raises(RuntimeError, match=r"cut.ark:\d+: ark ends inside a .*CM2 matrix.*rerun stage 1"):
            ArkReader().read(f"{cut}:{offset}", 41, 80)


def test_an_unknown_storage_is_refused_naming_the_choices() -> None:
    assert check_storage("uint16", "feats_storage") == "uint16"
    for bad in ("float16", "UINT16", 16, None):
        with pytest.raises(BadInputError, match=r"feats_storage: .* expected one of float32, uint16"):
            check_storage(bad, "feats_storage")


def run_stage1(root: Path, dump: str, *overrides: str) -> int:
    common = ["--config", str(CONFIG), "--data-dir", str(root / "data"), "--dump-dir", str(root / dump),
              "--sets", "train dev", "--train-set", "train", "--speed-perturb", "0.9 1.0 1.1",
              "--shard-size", "10", "--world-size", "1"]
    tail = ["--", *overrides] if overrides else []
    if rc := compute_fbank.main(["work", *common, "--rank", "0", *tail]):
        return rc
    return compute_fbank.main(["merge", *common, "--tokenizer-dir", str(root / dump / "tok"), *tail])


def ark_bytes(dump: Path) -> int:
    return sum(p.stat().st_size for p in dump.glob("*/shards/*.ark"))


def test_a_uint16_dump_halves_the_arks_and_holds_the_same_features(corpus: Path, dumped: Path) -> None:
    """Same utterances, lengths and targets as the float32 dump, each matrix the float32 one as uint16
    stores it; CMVN summed over the matrices as they are read back; the report says which storage."""
    assert run_stage1(corpus, "dump_u16", "++feats_storage=uint16") == 0
    half = corpus / "dump_u16"
    assert 0.49 < ark_bytes(half) / ark_bytes(dumped) < 0.52
    for name in ("train", "dev"):
        exact, small = jsonl(dumped / name / "data.jsonl"), jsonl(half / name / "data.jsonl")
        assert [(i["key"], i["source_len"], i["target"]) for i in exact] == \
            [(i["key"], i["source_len"], i["target"]) for i in small]
        for a, b in zip(exact, small, strict=True):
            want = stored(kaldiio.load_mat(a["source"]), "uint16")
            assert np.array_equal(kaldiio.load_mat(b["source"]), want), b["key"]
        assert json.loads((half / name / "report.json").read_text())["storage"] == "uint16"
    sources = {i["key"]: i["source"] for i in jsonl(dumped / "train" / "data.jsonl")}
    for shard in sorted((half / "train" / "shards").glob("*.jsonl")):
        back, exact = CmvnStats(), CmvnStats()
        for item in jsonl(shard):
            back.add_lfr(kaldiio.load_mat(item["source"]), 7, 6)
            exact.add_lfr(kaldiio.load_mat(sources[item["key"]]), 7, 6)
        saved = CmvnStats.load(shard.with_suffix(".stats.npz"))
        assert saved.count == back.count and np.array_equal(saved.sum, back.sum), shard
        assert np.array_equal(saved.sumsq, back.sumsq), shard
        assert not np.array_equal(saved.sum, exact.sum)  # so the check above tells the two apart


def test_changing_the_storage_recomputes_the_shards(corpus: Path, dumped: Path) -> None:
    """The storage is in the shards' fingerprint (not the default's, so that float32 dumps made before it
    was a choice stay valid): a uint16 run over a float32 dump rewrites every shard, and back."""
    def fingerprints(**storage: str) -> list[str]:
        plans = plan_sets(corpus / "data", corpus / "dump_x", ["train", "dev"], "train", "1.0", 10,
                          FbankConf(), **storage)
        return [p.fingerprint for p in plans]

    assert fingerprints() == fingerprints(storage="float32") != fingerprints(storage="uint16")
    for storage in ("uint16", "float32"):
        assert run_stage1(corpus, "dump_switch", f"++feats_storage={storage}") == 0
        for item in jsonl(corpus / "dump_switch" / "train" / "data.jsonl"):
            path, offset = item["source"].rsplit(":", 1)
            with open(path, "rb") as f:
                f.seek(int(offset))
                assert f.read(5) == {"uint16": b"\0BCM2", "float32": b"\0BFM "}[storage], item["key"]


def test_stage_1_refuses_an_unknown_storage(corpus: Path, capfd: pytest.CaptureFixture) -> None:
    assert run_stage1(corpus, "dump_bad", "++feats_storage=float16") == 2
    assert "feats_storage: 'float16' is not a feature storage" in capfd.readouterr().err
    assert not (corpus / "dump_bad").exists()
