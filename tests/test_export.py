"""local/export.py (stage 4): tiny random-init models of each family, in the hub's layout, exported to
ONNX, loaded by their deployment runtimes (funasr-onnx, or local/conformer_ctc_onnx.py) and checked
against PyTorch on real bundled speech; broken exports must fail the check.

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

import librosa
import numpy as np
import onnx
import pytest
import soundfile as sf
import torch
import yaml
from omegaconf import OmegaConf
from onnx import numpy_helper

from local.audio import load_audio
from local.cmvn import CmvnStats, write_am_mvn
from local.export import legacy_onnx_exporter, load_model, load_runtime, main, runtime_text
from local.fbank import FbankExtractor
from local.make_model_dir import make_model_dir
from local.make_tokenizer import build_tokenizer, model_file_name
from local.model_config import fbank_conf
from local.onnx_parity import check_parity, read_utterances, strip_tags
from local.ort_utils import greedy_ctc
from tests.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.test_configs import TINY

ROOT = Path(__file__).resolve().parents[1]
WORDS = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()
# family -> (recipe config, tokenizer kind)
FAMILIES = {"SenseVoiceSmall": ("tiny_sensevoice.yaml", "sensevoice"),
            "Paraformer": ("tiny_paraformer.yaml", "bpe"),
            "ConformerCTC": ("tiny_conformer_ctc.yaml", "bpe")}
N_UTTS = 20
UNGATED_INT8 = ["--max-int8-wer-delta", "100"]  # module docstring: int8 of random weights is not judged


@pytest.fixture(scope="module")
def data_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stage-0 style data.jsonl of 20 real 8 kHz digit clips: every speaker, every digit."""
    wavs = sorted(DEFAULT_WAV_DIR.glob("*.wav"))[::125][:N_UTTS]
    if len(wavs) < N_UTTS:
        pytest.skip(f"{DEFAULT_WAV_DIR}: the bundled corpus is missing")
    path = tmp_path_factory.mktemp("data") / "data.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for w in wavs:
            f.write(json.dumps({"key": w.stem, "source": str(w), "target": WORDS[int(w.stem.split("_")[0])],
                                "text_language": "<|en|>"}) + "\n")
    return path


def build_model_dir(root: Path, family: str, data: Path) -> Path:
    """A random-init model of ``family`` written by local/make_model_dir.py, as stage 3 writes one."""
    from funasr import AutoModel

    config_name, kind = FAMILIES[family]
    cfg = OmegaConf.load(ROOT / "conf" / config_name)
    spec = cfg.pop("build_tokenizer")
    for section, sizes in TINY.items():
        for key, value in sizes.items():
            if section in cfg and key in cfg[section]:
                cfg[section][key] = value
    tokenizer = build_tokenizer(data, root / "tokenizer", kind, int(spec.vocab_size),
                                spec.get("sp_type", "bpe"))
    conf = fbank_conf(cfg)
    stats, extractor = CmvnStats(), FbankExtractor(conf)
    for line in data.read_text().splitlines():
        stats.add_lfr(extractor.from_file(json.loads(line)["source"]), conf.lfr_m, conf.lfr_n)
    write_am_mvn(root / "am.mvn", *stats.mean_std())
    cfg.tokenizer_conf.bpemodel = str(tokenizer)
    cfg.frontend_conf.cmvn_file = str(root / "am.mvn")
    exp = root / "exp"
    exp.mkdir()
    OmegaConf.save(cfg, exp / "config.yaml")
    torch.manual_seed(0)
    model = AutoModel(**OmegaConf.to_container(cfg), device="cpu", disable_update=True, disable_log=True,
                      disable_pbar=True, ncpu=torch.get_num_threads()).model
    torch.save(model.state_dict(), exp / "model.pt")
    return make_model_dir(exp, "model.pt", root / "final")


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
    # What funasr-onnx needs of config.yaml (local/export.py's docstring says why).
    assert "cmvn_file" not in config["frontend_conf"] and config["frontend_conf"]["dither"] == 0.0
    assert config["tokenizer_conf"]["bpemodel"] == tokenizer
    assert config.get("lang") == ("en-bpe" if family == "Paraformer" else None)
    assert json.loads((out / "export.json").read_text())["family"] == family

    report = json.loads((out / "parity.json").read_text())
    assert report["family"] == family and report["utterances"] == N_UTTS and report["pass"] is True
    assert report["identical_fraction"] == 1.0 and report["mismatches"] == []
    assert report["max_abs_logit_diff"] < 1e-4 < report["max_abs_logit_diff_int8"]
    assert report["length_mismatches"] == [] and report["unreadable"] == []
    assert report["wer_torch"] == report["wer_fp32"] is not None and report["wer_int8"] is not None
    assert set(report["thresholds"]) == {"identical_fraction", "int8_wer_delta"}
    # The runtime check loaded the dir as a deployment does, fp32 and int8.
    smoke = report["runtime_check"]
    assert len(smoke["fp32"]) == len(smoke["int8"]) == 2 and all(isinstance(t, str) for t in smoke["fp32"])


def _sources(data_jsonl: Path, n: int) -> list[str]:
    return [u["source"] for u in read_utterances(data_jsonl, n)]


def _waves(data_jsonl: Path, n: int) -> list[np.ndarray]:
    """16 kHz mono audio of the first n clips, resampled as funasr-onnx's librosa.load(sr=16000) does."""
    waves = []
    for utt in read_utterances(data_jsonl, n):
        data, rate = load_audio(utt["source"])
        waves.append(librosa.resample(data.mean(axis=1), orig_sr=rate, target_sr=16000, res_type="soxr_hq"))
    return waves


def _features(runtime: Any, family: str, waves: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A padded feature batch made by the runtime's own frontend (funasr-onnx's WavFrontend)."""
    return runtime.features(waves) if family == "ConformerCTC" else runtime.extract_feat(waves)


def _onnx_scores(runtime: Any, family: str, feats: np.ndarray,
                 lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log-probs, output lengths) of a batch through the runtime's session."""
    if family == "SenseVoiceSmall":  # language "auto" (0), "woitn" (15): what PyTorch decodes with
        out = runtime.infer(feats, lengths, np.zeros(len(feats), np.int32), np.full(len(feats), 15, np.int32))
    else:
        out = runtime.infer(feats, lengths)
    return torch.log_softmax(torch.from_numpy(out[0]), dim=-1).numpy(), out[1]


def _torch_scores(automodel: Any, family: str, feats: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Log-probs of the same batch through the PyTorch model's own inference (as local/onnx_parity.py)."""
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
    fp32 = load_runtime(out, family, False, threads=2)
    feats, lengths = _features(fp32, family, waves)
    ref = _torch_scores(load_model(model_dir, threads=2), family, feats, lengths)
    scores, out_lens = _onnx_scores(fp32, family, feats, lengths)
    assert scores.shape == ref.shape and scores.shape[0] == batch
    for i, n in enumerate(out_lens.tolist()):
        np.testing.assert_allclose(scores[i, :n], ref[i, :n], atol=1e-4)
    int8, int8_lens = _onnx_scores(load_runtime(out, family, True, threads=2), family, feats, lengths)
    assert int8.shape == scores.shape and int8_lens.tolist() == out_lens.tolist()


def test_runtime_resamples_paths_but_takes_arrays_as_16k(exported: tuple[str, Path, Path, int],
                                                          data_jsonl: Path) -> None:
    """funasr-onnx resamples a file to 16 kHz on loading (librosa.load(sr=16000)), but takes an array as
    16 kHz audio whatever its rate: an 8 kHz array gives half the frames. The recipe's runner does the
    same."""
    family, _, out, _ = exported
    runtime = load_runtime(out, family, False, threads=2)
    sources, waves = _sources(data_jsonl, 3), _waves(data_jsonl, 3)
    # One 16 kHz array per call: funasr-onnx takes a list of paths, not of arrays.
    assert [runtime_text(r) for r in runtime(sources)] == [runtime_text(runtime(w)[0]) for w in waves]
    data, rate = load_audio(sources[0])
    assert rate == 8000
    frames = [runtime.frontend.fbank(w)[0].shape[0] for w in (data.mean(axis=1), waves[0])]  # 10 ms frames
    assert abs(frames[0] / frames[1] - 0.5) < 0.05


def test_rerun_skips_finished_export(exported: tuple[str, Path, Path, int], data_jsonl: Path) -> None:
    _, model_dir, out, _ = exported
    before = (out / "model.onnx").stat().st_mtime_ns
    assert main(["--model-dir", str(model_dir), "--out", str(out), "--data-jsonl", str(data_jsonl),
                 *UNGATED_INT8]) == 0
    assert (out / "model.onnx").stat().st_mtime_ns == before


def _break_output_layer(path: Path) -> None:
    """Make token 0 (CTC blank; Paraformer's blank, dropped) win every frame: empty transcripts."""
    model = onnx.load(str(path))
    bias = next(i for i in model.graph.initializer if i.name.endswith(("ctc_lo.bias", "output_layer.bias")))
    values = numpy_helper.to_array(bias).copy()
    values[0] += 100.0
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    onnx.save(model, str(path))


@pytest.mark.parametrize(("broken", "extra", "failure"), [
    ("model.onnx", UNGATED_INT8, "ONNX fp32 transcripts identical to PyTorch on 0.0%"),
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
    assert len(report["failures"]) == 1 and report["failures"][0].startswith(failure), report["failures"]
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
    assert strip_tags("<|en|> <|HAPPY|>seven <|x|>") == "seven <|x|>"  # only the leading tags
    best = np.array([0, 5, 5, 0, 5, 6, 6, 0])
    log_probs = np.log(np.eye(8)[best] + 1e-9)
    assert greedy_ctc(log_probs) == [5, 5, 6] and greedy_ctc(log_probs[:0]) == []


def test_read_utterances_names_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"key": "a", "source": "a.wav"}) + "\n" + json.dumps({"key": "b"}) + "\n")
    assert read_utterances(path, 1)[0]["key"] == "a"
    with pytest.raises(ValueError, match=r"data\.jsonl:2"):
        read_utterances(path)


def test_too_short_clip_is_empty_on_every_side(exported: tuple[str, Path, Path, int], tmp_path: Path) -> None:
    """40 ms: too short for conv2d subsampling (PyTorch raises, ONNX fails) and one LFR frame for the
    others. Whatever gives no output counts as an empty transcript, on every side alike."""
    family, model_dir, out, _ = exported
    wav = tmp_path / "short.wav"
    sf.write(wav, (np.random.default_rng(0).standard_normal(640) * 3000).astype(np.int16), 16000)
    utt = {"key": "short", "source": str(wav), "target": "ONE", "lang": "<|en|>"}
    report = check_parity(load_model(model_dir, threads=2), out, [utt], threads=2)
    assert report["identical_fraction"] == 1.0 and report["unreadable"] == []
    if family == "ConformerCTC":
        assert {e["side"] for e in report["no_output"]} == {"torch", "fp32", "int8"}


def test_runtime_pipeline_keeps_order_and_short_clips(exported: tuple[str, Path, Path, int],
                                                      tmp_path: Path) -> None:
    """OnnxASR overlaps the batches (features of the next, texts of the last) in a worker thread: the
    texts come back in input order and equal those of the same batches run one after another in this
    thread, and a clip too short for the model does not cost its batch the others' texts. (Batch sizes
    are not compared with each other: padding moves a random model's near-tied scores.)"""
    from local.onnx_asr import OnnxASR

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
