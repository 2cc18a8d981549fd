"""local/export.py (stage 4): tiny random-init models of each family, in the hub's layout, exported to
ONNX, loaded by the recipe's runtime (runtime/onnx_asr.py) and by funasr-onnx where it has the family,
and checked against PyTorch on real bundled speech; broken exports must fail the check.

Random weights emit garbage, but PyTorch and ONNX fp32 must emit the same garbage. int8 is not judged
on them: an untrained output layer's near-tied logits (25055 of them for SenseVoice) flip under any
quantisation, so its error rate says nothing; the int8 gate is tested by breaking model_quant.onnx.
"""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import soundfile as sf
import torch
import yaml
from onnx import numpy_helper

from funasr_recipe.data.manifest import read_utterances
from funasr_recipe.data.tags import strip_tags
from funasr_recipe.features.audio import load_audio
from funasr_recipe.features.fbank import resample
from funasr_recipe.model.model_dir import load_automodel
from funasr_recipe.model.tokenizer import model_file_name
from funasr_recipe.runtime import parity
from funasr_recipe.runtime.export import legacy_onnx_exporter
from funasr_recipe.runtime.onnx_asr import OnnxASR
from funasr_recipe.runtime.onnx_session import greedy_ctc
from funasr_recipe.runtime.parity import TorchSide, check_parity, int8_tolerance
from funasr_recipe.runtime.sherpa_onnx_export import missing_sherpa_files
from funasr_recipe.scoring.error_rate import corpus_counts
from local.export import main
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.helpers.model_dirs import (
    FAMILIES,
    N_UTTS,
    UNGATED_INT8,
    build_model_dir,
)


@pytest.fixture(scope="module", params=list(FAMILIES))
def exported(request: pytest.FixtureRequest, data_jsonl: Path,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path, int]:
    """(family, model dir, export dir, exit code of the stage program)."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    model_dir = build_model_dir(root, family, data_jsonl)
    out = root / "export"
    rc = main(["--model-dir", str(model_dir), "--out", str(out), "--data-jsonl", str(data_jsonl),
               *UNGATED_INT8])
    return family, model_dir, out, rc


def test_export_dir_loads_and_matches_pytorch(exported: tuple[str, Path, Path, int]) -> None:
    family, _, out, rc = exported
    assert rc == 0
    config = yaml.safe_load((out / "config.yaml").read_text())
    tokenizer = model_file_name("sensevoice") if family == "SenseVoiceSmall" else "tokenizer.model"
    for name in ("model.onnx", "model_quant.onnx", "am.mvn", "tokens.json", tokenizer, "parity.json",
                 ".done"):
        assert (out / name).is_file(), name
    # What funasr-onnx needs of config.yaml (runtime/export.py's docstring says why).
    assert "cmvn_file" not in config["frontend_conf"] and config["frontend_conf"]["dither"] == 0.0
    assert config["tokenizer_conf"]["bpemodel"] == tokenizer
    assert config.get("lang") == ("en-bpe" if family == "Paraformer" else None)
    assert json.loads((out / "export.json").read_text())["family"] == family

    report = json.loads((out / "parity.json").read_text())
    assert report["family"] == family and report["utterances"] == N_UTTS and report["pass"] is True
    assert report["identical_fraction"] == 1.0 and report["mismatches"] == []
    assert report["max_abs_logit_diff"] < 1e-4 < report["max_abs_logit_diff_int8"]
    assert report["length_mismatches"] == [] and report["unreadable"] == []
    # The deployed path: the runtime's numpy features from the files, then ONNX fp32.
    assert report["identical_fraction_runtime_frontend"] == 1.0 and report["feature_frame_mismatches"] == []
    assert 0 < report["feature_diff_p999"] <= report["max_abs_feature_diff"] < 1e-2
    assert report["wer_torch"] == report["wer_fp32"] is not None and report["wer_int8"] is not None
    assert set(report["thresholds"]) == {"identical_fraction", "int8_wer_delta", "feature_diff_p999",
                                        "max_abs_feature_diff"}
    # funasr-onnx loaded the dir as a deployment does, fp32 and int8, where it has a class for the family.
    smoke = report["runtime_check"]
    if family == "ConformerCTC":
        assert smoke["runtime"] is None and "no class for ConformerCTC" in smoke["note"]
    else:
        assert smoke["runtime"] == f"funasr_onnx.{family}"
        assert len(smoke["fp32"]) == len(smoke["int8"]) == 2
        assert all(isinstance(t, str) for t in smoke["fp32"])
    # sherpa-onnx's files (runtime/sherpa_onnx_export.py), SenseVoiceSmall only; its loader ran in a child.
    sherpa = report["sherpa_onnx_check"]
    if family == "SenseVoiceSmall":
        assert missing_sherpa_files(out) == []
        assert "tokens.txt" in json.loads((out / "export.json").read_text())["files"]
        assert sherpa["ok"] is True and len(sherpa["fp32"]) == len(sherpa["int8"]) == 2
    else:
        assert sherpa["runtime"] is None and not (out / "tokens.txt").exists()


def _sources(data_jsonl: Path, n: int) -> list[str]:
    return [u["source"] for u in read_utterances(data_jsonl, n)]


def _waves(data_jsonl: Path, n: int) -> list[np.ndarray]:
    """16 kHz mono audio of the first n clips, resampled with the recipe's (training) resampler."""
    waves = []
    for utt in read_utterances(data_jsonl, n):
        data, rate = load_audio(utt["source"])
        waves.append(resample(torch.from_numpy(data.mean(axis=1))[None], rate, 16000)[0].numpy())
    return waves


def _features(asr: OnnxASR, waves: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A padded feature batch made by the runtime's frontend."""
    feats = asr.features(waves)
    lengths = np.array([len(f) for f in feats], dtype=np.int32)
    batch = np.zeros((len(feats), int(lengths.max()), feats[0].shape[1]), dtype=np.float32)
    for i, f in enumerate(feats):
        batch[i, : len(f)] = f
    return batch, lengths


def _onnx_scores(asr: OnnxASR, feats: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log-probs, output lengths) of a batch through the runtime's session (SenseVoice: language "auto",
    "woitn", what PyTorch decodes with)."""
    scores, out_lens = asr.infer([feats[i, :n] for i, n in enumerate(lengths.tolist())])
    return torch.log_softmax(torch.from_numpy(scores), dim=-1).numpy(), out_lens


def _torch_scores(automodel: Any, family: str, feats: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Log-probs of the same batch through the PyTorch model's own inference (as runtime/parity.py)."""
    model = automodel.model
    scored = model.decoder if family == "Paraformer" else model.ctc.ctc_lo
    captured = []
    handle = scored.register_forward_hook(
        lambda _m, _i, o: captured.append(o[0] if isinstance(o, tuple) else o))
    lens = torch.from_numpy(lengths).long()
    with torch.no_grad():
        model.inference(torch.from_numpy(feats),
                        data_lengths=lens[:, None] if family == "Paraformer" else lens,
                        key=[f"u{i}" for i in range(len(feats))], tokenizer=automodel.kwargs["tokenizer"],
                        frontend=automodel.kwargs["frontend"], data_type="fbank", device="cpu")
    handle.remove()
    return torch.log_softmax(captured[-1], dim=-1).numpy()


@pytest.mark.parametrize("batch", [1, 3])
def test_onnx_matches_pytorch_on_padded_batches(exported: tuple[str, Path, Path, int], data_jsonl: Path,
                                                batch: int) -> None:
    """Batch and time axes are dynamic: one clip, and three of other lengths padded into one batch (neither
    the shape of the export's dummy input), give PyTorch's scores on that same batch: fp32 to 1e-4, int8
    the same shapes and lengths. Compared with PyTorch on the same batch rather than with each clip alone:
    funasr's Paraformer (predictor/decoder) and ConformerCTC's conv2d subsampling score a clip differently
    when it is padded, in PyTorch as in ONNX."""
    family, model_dir, out, _ = exported
    waves = _waves(data_jsonl, 3)[-batch:]
    assert len({len(w) for w in waves}) == batch
    fp32 = OnnxASR(out, threads=2)
    feats, lengths = _features(fp32, waves)
    ref = _torch_scores(load_automodel(model_dir, threads=2), family, feats, lengths)
    scores, out_lens = _onnx_scores(fp32, feats, lengths)
    assert scores.shape == ref.shape and scores.shape[0] == batch
    for i, n in enumerate(out_lens.tolist()):
        np.testing.assert_allclose(scores[i, :n], ref[i, :n], atol=1e-4)
    int8, int8_lens = _onnx_scores(OnnxASR(out, quantize=True, threads=2), feats, lengths)
    assert int8.shape == scores.shape and int8_lens.tolist() == out_lens.tolist()


def test_runtime_resamples_paths_but_takes_arrays_as_16k(exported: tuple[str, Path, Path, int],
                                                          data_jsonl: Path) -> None:
    """The runtime resamples a file to the model's 16 kHz on loading, but takes an array as 16 kHz audio
    whatever its rate (as funasr-onnx does): an 8 kHz array gives half the frames."""
    _, _, out, _ = exported
    asr = OnnxASR(out, threads=2)
    sources, waves = _sources(data_jsonl, 3), _waves(data_jsonl, 3)
    assert asr(sources) == [asr(w)[0] for w in waves]
    data, rate = load_audio(sources[0])
    assert rate == 8000
    frames = [asr.extractor.from_wave(w, 16000).shape[0] for w in (data.mean(axis=1), waves[0])]  # 10 ms
    assert abs(frames[0] / frames[1] - 0.5) < 0.05


def test_rerun_skips_finished_export(exported: tuple[str, Path, Path, int], data_jsonl: Path) -> None:
    _, model_dir, out, _ = exported
    before = (out / "model.onnx").stat().st_mtime_ns
    assert main(["--model-dir", str(model_dir), "--out", str(out), "--data-jsonl", str(data_jsonl),
                 *UNGATED_INT8]) == 0
    assert (out / "model.onnx").stat().st_mtime_ns == before


@pytest.mark.slow  # a second export check on the whole set
def test_check_only_adds_sherpa_files_to_an_old_export(exported: tuple[str, Path, Path, int],
                                                       data_jsonl: Path, tmp_path: Path) -> None:
    """An export made before stage 4 wrote sherpa-onnx's files gets them from --check-only."""
    family, model_dir, out, _ = exported
    if family != "SenseVoiceSmall":
        pytest.skip("sherpa-onnx's files are written for SenseVoiceSmall only")
    old = Path(shutil.copytree(out, tmp_path / "export"))
    (old / "tokens.txt").unlink()
    for name in ("model.onnx", "model_quant.onnx"):
        model = onnx.load(str(old / name))
        del model.metadata_props[:]
        onnx.save(model, str(old / name))
    assert "model.onnx:vocab_size" in missing_sherpa_files(old)
    assert main(["--model-dir", str(model_dir), "--out", str(old), "--data-jsonl", str(data_jsonl),
                 "--check-only", *UNGATED_INT8]) == 0
    assert missing_sherpa_files(old) == []
    assert json.loads((old / "parity.json").read_text())["sherpa_onnx_check"]["ok"] is True


def _break_output_layer(path: Path) -> None:
    """Make token 0 (CTC blank; Paraformer's blank, dropped) win every frame: empty transcripts."""
    model = onnx.load(str(path))
    bias = next(i for i in model.graph.initializer if i.name.endswith(("ctc_lo.bias", "output_layer.bias")))
    values = numpy_helper.to_array(bias).copy()
    values[0] += 100.0
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    onnx.save(model, str(path))


@pytest.mark.slow  # the export check run again on each broken copy
@pytest.mark.parametrize(("broken", "extra", "failure"), [
    ("model.onnx", UNGATED_INT8, "ONNX fp32 transcripts"),
    ("model_quant.onnx", [], "int8 error rate"),
])
def test_broken_export_fails_the_check(exported: tuple[str, Path, Path, int], data_jsonl: Path,
                                       tmp_path: Path, broken: str, extra: list[str], failure: str) -> None:
    _, model_dir, out, _ = exported
    copy_dir = Path(shutil.copytree(out, tmp_path / "export"))
    _break_output_layer(copy_dir / broken)
    rc = main(["--model-dir", str(model_dir), "--out", str(copy_dir), "--data-jsonl", str(data_jsonl),
               "--check-only", *extra])
    report = json.loads((copy_dir / "parity.json").read_text())
    assert rc == 1 and report["pass"] is False and not (copy_dir / ".done").exists()
    # A broken fp32 graph fails both fp32 gates: on the model's features and on the runtime's own.
    assert len(report["failures"]) == (2 if broken == "model.onnx" else 1), report["failures"]
    assert all(f.startswith(failure) for f in report["failures"]), report["failures"]
    if broken == "model.onnx":
        assert len(report["mismatches"]) == N_UTTS and all(m["fp32"] == "" for m in report["mismatches"])
    else:
        # Empty int8 transcripts score 100% (all deletions); random weights' garbage does not.
        assert report["identical_fraction"] == 1.0 and abs(report["wer_fp32"] - 1.0) > 0.01
        assert report["wer_int8"] == 1.0


def test_missing_model_dir_is_an_input_error(tmp_path: Path, data_jsonl: Path) -> None:
    assert main(["--model-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "x"),
                 "--data-jsonl", str(data_jsonl)]) == 2


def test_legacy_exporter_is_patched_only_inside_the_block() -> None:
    original = torch.onnx.export
    # Why the patch exists: torch's default is the dynamo exporter. If this fails, reconsider it.
    assert inspect.signature(original).parameters["dynamo"].default is True
    with legacy_onnx_exporter():
        assert torch.onnx.export is not original and torch.onnx.export.keywords == {"dynamo": False}
    assert torch.onnx.export is original


def test_strip_tags_and_greedy_ctc() -> None:
    assert strip_tags("<|en|><|NEUTRAL|><|Speech|><|woitn|>one two") == "one two"
    assert strip_tags("<|en|> <|HAPPY|>seven <|x|>") == "seven"  # every tag, wherever it is
    best = np.array([0, 5, 5, 0, 5, 6, 6, 0])
    log_probs = np.log(np.eye(8)[best] + 1e-9)
    assert greedy_ctc(log_probs) == [5, 5, 6] and greedy_ctc(log_probs[:0]) == []


def test_read_utterances_names_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"key": "a", "source": "a.wav"}) + "\n" + json.dumps({"key": "b"}) + "\n")
    assert read_utterances(path, 1)[0]["key"] == "a"
    with pytest.raises(ValueError, match=r"data\.jsonl:2"):
        read_utterances(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match=r"data\.jsonl: no utterances"):
        read_utterances(path)
    with pytest.raises(FileNotFoundError):
        read_utterances(tmp_path / "missing.jsonl")


def test_too_short_clip_is_empty_on_every_side(exported: tuple[str, Path, Path, int], tmp_path: Path) -> None:
    """40 ms: too short for conv2d subsampling (PyTorch raises, ONNX fails) and one LFR frame for the
    others. Whatever gives no output counts as an empty transcript, on every side alike."""
    family, model_dir, out, _ = exported
    wav = tmp_path / "short.wav"
    sf.write(wav, (np.random.default_rng(0).standard_normal(640) * 3000).astype(np.int16), 16000)
    utt = {"key": "short", "source": str(wav), "target": "ONE", "lang": "<|en|>"}
    report = check_parity(load_automodel(model_dir, threads=2), out, [utt], threads=2)
    assert report["identical_fraction"] == 1.0 and report["unreadable"] == []
    if family == "ConformerCTC":
        assert {e["side"] for e in report["no_output"]} == {"torch", "fp32", "int8", "fp32 runtime frontend"}


def test_parity_by_length_reports_what_one_at_a_time_does(exported: tuple[str, Path, Path, int],
                                                          data_jsonl: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The check decodes equal-length utterances together (runtime/parity.py): its report is the one of
    one utterance at a time (BATCH_FRAMES 1), into which no padding can enter either."""
    family, model_dir, out, _ = exported
    utts = read_utterances(data_jsonl)
    utts += [{**u, "key": f"{u['key']}-again"} for u in utts]  # every length twice at least
    automodel = load_automodel(model_dir, threads=2)
    feats = [TorchSide(automodel).features(u["source"]) for u in utts]
    assert len(parity.batches(feats, family)) == (len(utts) if family == "Paraformer" else
                                                  len({f.shape[0] for f in feats}))
    together = check_parity(automodel, out, utts)
    monkeypatch.setattr(parity, "BATCH_FRAMES", 1)
    alone = check_parity(automodel, out, utts)
    for key in ("identical_fraction", "identical_fraction_int8", "wer_torch", "wer_fp32", "wer_int8",
                "mismatches", "length_mismatches", "no_output", "pass"):
        assert together[key] == alone[key], key
    assert together["max_abs_logit_diff"] == pytest.approx(alone["max_abs_logit_diff"], abs=1e-5)


def test_runtime_pipeline_keeps_order_and_short_clips(exported: tuple[str, Path, Path, int],
                                                      tmp_path: Path) -> None:
    """OnnxASR overlaps the batches (features of the next, texts of the last) in a worker thread: the
    texts come back in input order and equal those of the same batches run one after another in this
    thread, and a clip too short for the model does not cost its batch the others' texts. (Batch sizes
    are not compared with each other: padding moves a random model's near-tied scores.)"""
    _, _, out, _ = exported
    short = tmp_path / "short.wav"
    sf.write(short, (np.random.default_rng(0).standard_normal(640) * 3000).astype(np.int16), 16000)
    clips = [str(p) for p in sorted(DEFAULT_WAV_DIR.glob("*.wav"))[::300][:6]]
    clips.insert(2, str(short))
    asr = OnnxASR(out, threads=2)
    for batch in (1, 2, 3, 7):
        asr.batch_size = batch
        in_turn = [t for i in range(0, len(clips), batch)
                   for t in asr._batch(asr.features(clips[i:i + batch]))]
        assert len(in_turn) == len(clips) and asr(clips) == in_turn, batch
    assert asr([]) == []


def test_int8_gate_allows_one_unit_on_a_small_set() -> None:
    """The int8 gate never fails on a single word of difference (50 one-word clips: 2 points), and on a
    set where one word is small it is the configured delta that judges."""
    def units(refs: list[str], lang: str) -> int:  # what _check_parity passes: the scorer's count
        return corpus_counts(refs, refs, [lang] * len(refs)).n_ref

    few = units(["seven"] * 50, "en")
    assert int8_tolerance(0.01, few) == pytest.approx(0.02)
    assert 0.32 - 0.30 <= int8_tolerance(0.01, few) < 0.04
    assert int8_tolerance(0.01, units(["one two"] * 500, "en")) == pytest.approx(0.01)
    assert int8_tolerance(0.01, units(["一二三"], "zh")) == pytest.approx(1 / 3)  # characters for zh
