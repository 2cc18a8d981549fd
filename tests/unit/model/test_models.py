"""local/models.py: the recipe's Conformer-CTC trains, decodes through funasr and exports to ONNX."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from funasr.frontends.wav_frontend import WavFrontend
from funasr.register import tables
from funasr.tokenizer.sentencepiece_tokenizer import SentencepiecesTokenizer
from omegaconf import OmegaConf

from funasr_recipe.model.conformer_ctc import ConformerCTC, edit_distance
from funasr_recipe.model.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parents[3]
DIGITS = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()


def config(name: str = "tiny_conformer_ctc.yaml") -> dict:
    return OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / name), resolve=True)


def build(cfg: dict, vocab_size: int = 16, **over: object) -> ConformerCTC:
    """The model as funasr's AutoModel builds it: model_conf and the top-level keys as kwargs."""
    torch.manual_seed(0)
    return tables.model_classes.get(cfg["model"])(**{**cfg["model_conf"], **cfg, **over},
                                                  input_size=80, vocab_size=vocab_size)


def batch(sizes: tuple[int, ...] = (90, 60, 31), dim: int = 80) -> dict[str, torch.Tensor]:
    """Padded random features with targets padded by -1, as funasr's collator pads them."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor(sizes)
    speech = torch.randn(len(sizes), max(sizes), dim, generator=g)
    speech[torch.arange(max(sizes))[None, :] >= lengths[:, None]] = 0.0
    targets = [[4, 5, 6], [7, 8], [9]][: len(sizes)]
    text = torch.full((len(sizes), 3), -1)
    for i, t in enumerate(targets):
        text[i, : len(t)] = torch.tensor(t)
    return {"speech": speech, "speech_lengths": lengths, "text": text,
            "text_lengths": torch.tensor([len(t) for t in targets])}


@pytest.fixture(scope="module")
def bpemodel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    rng = np.random.default_rng(0)
    with open(out / "data.jsonl", "w", encoding="utf-8") as f:
        for i in range(200):
            words = " ".join(rng.choice(DIGITS, size=int(rng.integers(1, 4))))
            f.write(json.dumps({"key": f"u{i}", "target": words}) + "\n")
    return build_tokenizer(out / "data.jsonl", out, kind="bpe", vocab_size=32)


def test_forward_backward_gives_finite_loss_and_stats() -> None:
    model = build(config())
    loss, stats, weight = model(**batch())
    loss.backward()
    assert torch.isfinite(loss).all() and loss.shape == (1,)
    assert set(stats) == {"loss", "loss_ctc"} and int(weight) == 3
    assert all(p.grad is not None for p in model.encoder.parameters() if p.requires_grad)
    model.eval()
    assert "cer_ctc" in model(**batch())[1]  # validation also reports the greedy token error rate


def test_overfits_a_fixed_batch() -> None:
    model = build(config())
    data = batch()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)

    def eval_loss() -> float:
        model.eval()
        with torch.no_grad():
            return model(**data)[0].item()

    before = eval_loss()
    for _ in range(15):
        model.train()
        opt.zero_grad()
        model(**data)[0].backward()
        opt.step()
    assert eval_loss() < 0.5 * before


def test_gpu_config_builds_and_forwards() -> None:
    model = build(config("conformer_ctc.yaml"), vocab_size=5000).eval()
    with torch.no_grad():
        loss = model(**batch((40, 33)))[0]
    assert torch.isfinite(loss).all()
    assert 30e6 < sum(p.numel() for p in model.parameters()) < 40e6  # as the config's comment says


@pytest.mark.parametrize(("model", "extra", "error", "message"), [
    ("CTC", {}, ValueError, "too many values to unpack"),  # CTC.encode expects 2 values, gets 3
    ("Conformer", {"ctc_weight": 1.0}, TypeError, "'NoneType' object is not callable"),  # decoder None
])
def test_funasr_own_ctc_conformer_still_crashes(model: str, extra: dict, error: type, message: str) -> None:
    """Why local/models.py exists. If this fails, funasr fixed it: reconsider the recipe's own class."""
    import funasr.models.conformer.model  # noqa: F401  (registers Conformer)
    import funasr.models.ctc.model  # noqa: F401  (registers CTC)

    enc = {"output_size": 32, "attention_heads": 2, "linear_units": 64, "num_blocks": 1,
           "cnn_module_kernel": 3, "rel_pos_type": "latest"}
    funasr_model = tables.model_classes.get(model)(encoder="ConformerEncoder", encoder_conf=enc,
                                                    input_size=80, vocab_size=16, **extra)
    with pytest.raises(error, match=message):
        funasr_model(**batch())


def test_greedy_search_collapses_repeats_and_drops_blanks() -> None:
    model = build(config())
    best = torch.tensor([[0, 5, 5, 0, 5, 6, 6, 0], [7, 7, 0, 0, 0, 0, 0, 0]])
    log_probs = torch.nn.functional.one_hot(best, 16).float().log()
    assert model.greedy_search(log_probs, torch.tensor([8, 5])) == [[5, 5, 6], [7]]
    assert edit_distance([1, 2, 3], [1, 3, 4, 5]) == 3 and edit_distance([], [2]) == 1


def test_inference_on_fbank_and_waveforms(bpemodel: Path) -> None:
    tokenizer = SentencepiecesTokenizer(bpemodel=bpemodel, unk_symbol="<unk>")
    model = build(config(), vocab_size=tokenizer.get_vocab_size()).eval()
    feats = batch()["speech"]
    results, _ = model.inference(feats, data_lengths=torch.tensor([90, 60, 31]), key=["a", "b", "c"],
                                 tokenizer=tokenizer, data_type="fbank", device="cpu")
    assert [r["key"] for r in results] == ["a", "b", "c"]
    assert all(isinstance(r["text"], str) and r["text"] == tokenizer.decode(r["token_int"]) for r in results)

    conf = config()["frontend_conf"]
    frontend = WavFrontend(**{**conf, "dither": 0.0})
    waves = [np.random.default_rng(i).standard_normal(n).astype(np.float32) * 0.1
             for i, n in enumerate((16000, 7000))]
    results, meta = model.inference(waves, key=["w1", "w2"], tokenizer=tokenizer, frontend=frontend,
                                    device="cpu")
    assert [r["key"] for r in results] == ["w1", "w2"] and all(isinstance(r["text"], str) for r in results)
    assert meta["batch_data_time"] > 0


def test_automodel_builds_and_decodes_from_the_config(bpemodel: Path) -> None:
    from funasr import AutoModel

    cfg = config()
    cfg.pop("build_tokenizer")  # recipe-only key
    cfg["tokenizer_conf"]["bpemodel"] = str(bpemodel)
    automodel = AutoModel(**cfg, device="cpu", disable_update=True, disable_pbar=True, disable_log=True)
    assert isinstance(automodel.model, ConformerCTC)
    waves = [np.random.default_rng(i).standard_normal(12000).astype(np.float32) * 0.1 for i in range(2)]
    results = automodel.generate(input=waves, key=["x", "y"], batch_size=2)
    assert [r["key"] for r in results] == ["x", "y"] and all(isinstance(r["text"], str) for r in results)


def test_onnx_export_matches_pytorch_on_other_batch_and_length(tmp_path: Path) -> None:
    model = build(config(), vocab_size=40).eval()
    exported = model.export().eval()
    dummy = exported.export_dummy_inputs()
    path = tmp_path / exported.export_name()
    torch.onnx.export(exported, dummy, str(path), dynamo=False, opset_version=14,
                      input_names=exported.export_input_names(),
                      output_names=exported.export_output_names(),
                      dynamic_axes=exported.export_dynamic_axes())

    data = batch((150, 97, 20))  # 3 utterances where the dummy had 2, longer, one much shorter
    speech, lengths = data["speech"], data["speech_lengths"].to(torch.int32)
    assert speech.shape[0] != dummy[0].shape[0] and speech.shape[1] != dummy[0].shape[1]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    log_probs, out_lens = session.run(None, {"speech": speech.numpy(), "speech_lengths": lengths.numpy()})
    with torch.no_grad():
        encoder_out, ref_lens = model.encode(speech, lengths)
        ref = model.ctc.log_softmax(encoder_out)
    assert log_probs.shape == tuple(ref.shape) and log_probs.shape[-1] == 40
    assert out_lens.tolist() == ref_lens.tolist()
    assert np.abs(log_probs - ref.numpy()).max() < 1e-4
