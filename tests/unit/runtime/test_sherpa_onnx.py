"""sherpa-onnx on the recipe's export: the files stage 4 writes for it (runtime/sherpa_onnx_export.py), its
loader run in a child process (runtime/sherpa_onnx_runtime.py; it exits the process on a missing key),
its transcripts of the trained model's dev set against the recipe's runtime, and its benchmark rows.

The cheap tests use tests/helpers/word_exports.py's export dir (a tiny graph with SenseVoice's interface);
the transcripts and the rows come from the ``trained`` session fixture (stages 2-5 through run.sh).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from funasr_recipe.data.tags import strip_tags
from funasr_recipe.features.audio import load_audio
from funasr_recipe.features.cmvn import read_am_mvn, write_am_mvn
from funasr_recipe.features.numpy_fbank import mono_at_rate
from funasr_recipe.runtime.funasr_onnx_runtime import load_funasr_onnx
from funasr_recipe.runtime.onnx_asr import OnnxASR
from funasr_recipe.runtime.sherpa_onnx_export import (
    MODEL_FILES,
    REQUIRED_KEYS,
    TOKENS,
    missing_sherpa_files,
    write_sherpa_files,
)
from funasr_recipe.runtime.sherpa_onnx_runtime import SherpaASR, sherpa_check, sherpa_subprocess
from tests.helpers.word_exports import multi_word_tokenizer, words_export

# sherpa-onnx's own loader, nothing of the recipe's in between: what a deployment runs.
LOAD = ("import sys, sherpa_onnx; "
        "sherpa_onnx.OfflineRecognizer.from_sense_voice(model=sys.argv[1], tokens=sys.argv[2])")


def load_in_child(export: Path, model: str = "model.onnx") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOAD, str(export / model), str(export / TOKENS)],
                          capture_output=True, text=True, timeout=120)


def metadata(path: Path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sherpa")
    return words_export(root, multi_word_tokenizer(root, "word", 64), ["▁NINE", "▁ZERO"])


def test_loader_reads_every_required_key(export: Path, tmp_path: Path) -> None:
    """With the metadata stage 4 writes, sherpa-onnx's loader loads both files; without any one of
    REQUIRED_KEYS it ends the process naming that key (so each one is needed, and none is missing)."""
    for name in MODEL_FILES:
        ok = load_in_child(export, name)
        assert ok.returncode == 0, ok.stderr[-2000:]
    model = onnx.load(str(export / "model.onnx"))
    for key in REQUIRED_KEYS:
        broken = onnx.ModelProto()
        broken.CopyFrom(model)
        kept = [(p.key, p.value) for p in broken.metadata_props if p.key != key]
        del broken.metadata_props[:]
        for k, v in kept:
            broken.metadata_props.add(key=k, value=v)
        onnx.save(broken, str(tmp_path / f"{key}.onnx"))
        res = load_in_child(export, str(tmp_path / f"{key}.onnx"))
        said = re.search(rf"\b'?{key}'? does not exist in the metadata", res.stderr)
        assert res.returncode != 0 and said, (key, res.stderr)


def test_metadata_is_the_export_s_own(export: Path, tmp_path: Path) -> None:
    """neg_mean/inv_stddev are am.mvn's float32 values exactly, the LFR settings config.yaml's, the
    vocabulary the tokenizer's (tokens.txt one "piece id" line each); rewriting replaces, never adds."""
    rng = np.random.default_rng(0)
    write_am_mvn(export / "am.mvn", rng.normal(size=560), rng.uniform(0.5, 2.0, size=560))
    assert write_sherpa_files(export) == [export / n for n in (*MODEL_FILES, TOKENS)]
    shift, scale = read_am_mvn(export / "am.mvn")
    tokens = (export / TOKENS).read_text(encoding="utf-8").splitlines()
    vocab = json.loads((export / "tokens.json").read_text(encoding="utf-8"))
    assert tokens == [f"{p} {i}" for i, p in enumerate(vocab)]
    frontend = yaml.safe_load((export / "config.yaml").read_text())["frontend_conf"]
    for name in MODEL_FILES:
        props = onnx.load(str(export / name)).metadata_props
        assert len(props) == len({p.key for p in props})
        meta = metadata(export / name)
        assert np.array_equal(np.array(meta["neg_mean"].split(","), dtype=np.float32), shift)
        assert np.array_equal(np.array(meta["inv_stddev"].split(","), dtype=np.float32), scale)
        assert int(meta["vocab_size"]) == len(vocab) and meta["normalize_samples"] == "0"
        assert (int(meta["lfr_window_size"]), int(meta["lfr_window_shift"])) == (frontend["lfr_m"],
                                                                                  frontend["lfr_n"])
        assert "Nano" not in meta["comment"]  # the loader takes a "Nano" comment for another model
    assert missing_sherpa_files(export) == []


def test_an_unloadable_export_is_reported_not_fatal(export: Path, tmp_path: Path) -> None:
    """Without tokens.txt or a key: SherpaASR raises (before sherpa-onnx could end this process), and the
    stage-4 check reports the failure instead of raising."""
    broken = tmp_path / "export"
    broken.mkdir()
    for f in export.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / TOKENS).unlink()
    assert missing_sherpa_files(broken) == [TOKENS]
    with pytest.raises(RuntimeError, match="tokens.txt"):
        SherpaASR(broken)
    report = sherpa_check(broken, "SenseVoiceSmall", ["a.wav"], threads=1)  # fails before reading it
    assert report["ok"] is False and "tokens.txt" in report["error"]
    assert sherpa_check(broken, "Paraformer", [], threads=1)["runtime"] is None


def test_other_families_and_frontends_get_no_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "export.json").write_text(json.dumps({"family": "Paraformer"}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"model": "Paraformer"}))
    with caplog.at_level("INFO"):
        assert write_sherpa_files(tmp_path) == []
    assert "SenseVoice loader only" in caplog.text and not (tmp_path / TOKENS).exists()
    (tmp_path / "export.json").write_text(json.dumps({"family": "SenseVoiceSmall"}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"model": "SenseVoiceSmall",
                                                          "frontend_conf": {"window": "povey"}}))
    assert write_sherpa_files(tmp_path) == [] and "window 'povey'" in caplog.text


def _dev(prepared: Path) -> list[str]:
    return [json.loads(line)["source"] for line in (prepared / "data" / "dev" / "data.jsonl").read_text()
            .splitlines()]


# int8: onnxruntime's dynamic quantization rounds each activation tensor to a scale taken from its range,
# so two frontends whose features differ by float rounding (kaldi-native-fbank's and ours) can land a value
# on either side of a rounding step and part on one borderline utterance ("FOUR" against "FOUR ONE" on 1 of
# 50, in a model trained on an AVX2 CPU); fp32 must agree exactly.
INT8_ROUNDING = 1


@pytest.mark.parametrize(("quantize", "batch"), [(False, 1), (True, 1), (False, 8)])
def test_sherpa_transcribes_the_dev_set_as_ours(prepared: Path, trained: Path, quantize: bool,
                                                 batch: int) -> None:
    """Stage 4's export of the trained model, as sherpa-onnx's from_sense_voice loads it (in a child):
    its transcripts of the dev set (8 kHz files) equal the recipe's runtime's, tags stripped; int8 may part on
    one borderline utterance (see INT8_ROUNDING)."""
    export, sources = trained / "export", _dev(prepared)
    assert missing_sherpa_files(export) == []
    parity = json.loads((export / "parity.json").read_text())["sherpa_onnx_check"]
    assert parity["ok"] is True and len(parity["fp32"]) == len(parity["int8"]) == 2
    ours = [strip_tags(t) for t in OnnxASR(export, quantize=quantize, threads=2, batch_size=batch)(sources)]
    theirs = sherpa_subprocess(export, sources, quantize, threads=2, batch_size=batch)
    assert any(ours) and len(theirs) == len(ours)
    differ = [(s, a, b) for s, a, b in zip(sources, ours, theirs, strict=True) if a != b]
    assert len(differ) <= (INT8_ROUNDING if quantize else 0), differ


def test_benchmark_has_sherpa_rows(trained: Path) -> None:
    """Stage 5 measured sherpa-onnx beside the others in the same run, fp32 and int8 at every batch
    size, on texts that match AutoModel's (tags stripped) as ours do. Speed is reported, not asserted."""
    report = json.loads((trained / "benchmark.json").read_text())
    rows = {(r["runtime"], r["precision"], r["batch"]): r for r in report["rows"]}
    one = 1 / report["utterances"] + 1e-9
    for batch in report["batch_sizes"]:
        for precision in ("fp32", "int8"):
            sherpa, ours = rows[("sherpa_onnx", precision, batch)], rows[("ours", precision, batch)]
            assert sherpa["utt_per_s"] > 0
            allowed = INT8_ROUNDING * one if precision == "int8" else 0
            assert abs(sherpa["same_text_as_pytorch"] - ours["same_text_as_pytorch"]) <= allowed
    assert "sherpa-onnx" in (trained / "benchmark.md").read_text()


def test_funasr_onnx_needs_our_resampling(prepared: Path, trained: Path) -> None:
    """The model card's advice: funasr-onnx given arrays resampled to 16 kHz with the recipe's (torchaudio)
    resampler transcribes the 8 kHz dev set as the recipe's runtime does; given the 8 kHz arrays as read,
    it takes them for 16 kHz audio and gets other texts."""
    export, sources = trained / "export", _dev(prepared)
    ours = OnnxASR(export, threads=2)(sources)
    model = load_funasr_onnx(export, "SenseVoiceSmall", quantize=False, threads=2)
    waves = [load_audio(s) for s in sources]
    assert {rate for _, rate in waves} == {8000}
    assert [model(mono_at_rate(w, rate, 16000))[0] for w, rate in waves] == ours
    as_read = [model(w[:, 0])[0] for w, _ in waves]
    assert sum(a == b for a, b in zip(as_read, ours, strict=True)) < len(ours) / 2
