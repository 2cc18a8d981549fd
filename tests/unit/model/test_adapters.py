"""funasr_recipe/model/adapters.py on tiny random-init SenseVoiceSmall models: LoRA injection, merging,
freeze checks, the adapter record, finish_state_dict, and the ONNX export of a merged model.

Reads conf/tiny_sensevoice.yaml and the bundled digit clips (the export test); writes under tmp paths.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
import torch

from funasr_recipe.model.adapters import (
    ADAPTER_FILE,
    FROZEN_FILE,
    LoraSpec,
    finish_state_dict,
    freeze_check,
    inject_lora,
    lora_layers,
    merge_lora_state,
    read_adapter_json,
    write_adapter_json,
)
from funasr_recipe.model.averaging import average_fp32
from funasr_recipe.model.checkpoint import safe_load
from funasr_recipe.model.model_dir import load_automodel
from funasr_recipe.runtime.export import export_onnx
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.helpers.model_dirs import WORDS, build_model_dir
from tests.helpers.tiny_models import tiny_sensevoice

SPEC = LoraSpec.with_defaults(rank=4)




def randomize_adapters(model: torch.nn.Module) -> None:
    """peft starts B at zero (the adapter adds nothing); trained adapters do not."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.2)


def ctc_log_probs(model: torch.nn.Module, feats: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        # clone: the SANM encoder scales its input in place
        out, _ = model.encoder(feats.clone(), lengths)[:2]
        return model.ctc.log_softmax(out)


def test_merged_model_equals_the_adapter_model() -> None:
    model = tiny_sensevoice()
    base_keys = set(model.state_dict())
    layers = inject_lora(model, SPEC)
    randomize_adapters(model)
    model.eval()
    merged = merge_lora_state(model.state_dict(), SPEC)
    assert set(merged) == base_keys  # exactly the base graph's keys, no lora_*
    fresh = tiny_sensevoice(seed=7)
    fresh.load_state_dict(merged, strict=True)
    feats, lengths = torch.randn(2, 40, 560), torch.tensor([40, 25])
    adapted, plain = ctc_log_probs(model, feats, lengths), ctc_log_probs(fresh, feats, lengths)
    torch.testing.assert_close(plain, adapted, atol=1e-5, rtol=0)
    # The adapters matter: without them (the base weights alone) the output is another one.
    base_only = {k: v for k, v in merged.items()}
    for layer in layers:
        base_only[f"{layer}.weight"] = model.state_dict()[f"{layer}.base_layer.weight"]
    fresh.load_state_dict(base_only)
    assert (ctc_log_probs(fresh, feats, lengths) - adapted).abs().max() > 1e-2


def test_only_the_adapters_train() -> None:
    model = tiny_sensevoice()
    layers = inject_lora(model, SPEC)
    # Every SANM block's attention and feed-forward (encoders0, encoders, tp_encoders), not the output layer.
    assert len(layers) == 4 * sum(1 for n, _ in model.named_modules() if n.endswith(".feed_forward"))
    assert "ctc.ctc_lo" not in layers
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    modules = dict(model.named_modules())
    expected = sum(SPEC.rank * (modules[n].base_layer.in_features + modules[n].base_layer.out_features)
                   for n in layers)
    assert freeze_check(model, ())[0] == expected


def test_regex_targets_choose_by_full_name() -> None:
    model = tiny_sensevoice()
    chosen = lora_layers(model, (r"encoder\.encoders\.\d+\.self_attn\.linear_q_k_v",))
    assert chosen and all(n.startswith("encoder.encoders.") and n.endswith("linear_q_k_v") for n in chosen)


def test_a_target_that_names_no_linear_is_refused() -> None:
    model = tiny_sensevoice()
    with pytest.raises(ValueError, match=r"LoRA target 'linear_qkv' names no nn.Linear") as info:
        inject_lora(model, LoraSpec.with_defaults(4, ("w_1", "linear_qkv")))
    assert "encoder.encoders.N.self_attn.linear_q_k_v" in str(info.value)  # what exists, shortened
    assert not any(".lora_" in k for k in model.state_dict())  # refused before peft touched the model
    with pytest.raises(ValueError, match="'self_attn' names no nn.Linear"):  # a module, not a Linear
        lora_layers(model, ("self_attn",))


def test_bad_specs_are_refused() -> None:
    for kwargs in ({"rank": 0}, {"rank": 4, "targets": ()}, {"rank": 4, "dropout": 1.0}):
        with pytest.raises(ValueError):
            LoraSpec.with_defaults(**kwargs)
    assert LoraSpec.with_defaults(8).alpha == 16.0


def test_freeze_prefix_that_names_nothing_is_refused() -> None:
    model = tiny_sensevoice()
    total = sum(p.numel() for p in model.parameters())
    assert freeze_check(model, ("encoder", "ctc.ctc_lo")) == (total, total)  # it checks, it does not freeze
    for bad in ("encoders", "enc", "encoder.nope"):  # whole dotted components only, as funasr matches
        with pytest.raises(ValueError, match=f"freeze prefix '{bad}' names no parameter") as info:
            freeze_check(model, ("encoder", bad))
        assert "top-level modules: encoder, ctc, embed" in str(info.value)


def test_merge_needs_each_adapters_base_weight() -> None:
    model = tiny_sensevoice()
    inject_lora(model, SPEC)
    state = model.state_dict()
    key = "encoder.encoders.0.feed_forward.w_1.base_layer.weight"
    with pytest.raises(ValueError, match="encoder.encoders.0.feed_forward.w_1 has no base weight"):
        merge_lora_state({k: v for k, v in state.items() if k != key}, SPEC)


def test_adapter_json_round_trip(tmp_path: Path) -> None:
    assert read_adapter_json(tmp_path) is None
    write_adapter_json(tmp_path, SPEC, ("embed",))
    assert read_adapter_json(tmp_path) == (SPEC, ("embed",))
    write_adapter_json(tmp_path, None, ("encoder", "ctc"))
    assert read_adapter_json(tmp_path) == (None, ("encoder", "ctc"))
    (tmp_path / ADAPTER_FILE).write_text('{"lora": {"rank": 4}}')
    with pytest.raises(ValueError, match="not an adapter record"):
        read_adapter_json(tmp_path)


def test_finish_state_dict_restores_frozen_fp32_and_merges(tmp_path: Path) -> None:
    """As a DeepSpeed bf16 checkpoint of a LoRA run reads: zero_to_fp32 gives the adapters only (frozen
    parameters have no fp32 master), the module copy is bf16."""
    model = tiny_sensevoice()
    plain = {k: v.clone() for k, v in model.state_dict().items()}
    assert finish_state_dict(tmp_path, plain) is plain  # no adapter.json: every existing run, unchanged
    inject_lora(model, SPEC)
    randomize_adapters(model)
    full = model.state_dict()
    frozen = {k: p.detach().clone() for k, p in model.named_parameters() if not p.requires_grad}
    torch.save(frozen, tmp_path / FROZEN_FILE)
    write_adapter_json(tmp_path, SPEC, ())
    masters = {k: v for k, v in full.items() if ".lora_" in k}
    finished = finish_state_dict(tmp_path, masters)
    assert set(finished) == set(plain)
    for k, v in merge_lora_state(full, SPEC).items():
        assert torch.equal(finished[k], v), k
    # bf16 module copies of frozen parameters are replaced by the fp32 ones, not kept.
    rounded = {k: v.bfloat16().float() if k in frozen else v for k, v in full.items()}
    assert torch.equal(finish_state_dict(tmp_path, rounded)["ctc.ctc_lo.weight"], plain["ctc.ctc_lo.weight"])
    # A finished (merged) state, e.g. an average of finished checkpoints, comes back as it went in.
    again = finish_state_dict(tmp_path, finished)
    assert all(torch.equal(again[k], finished[k]) for k in finished)
    (tmp_path / FROZEN_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=FROZEN_FILE):
        finish_state_dict(tmp_path, masters)


def test_average_of_lora_checkpoints_is_the_mean_of_the_merged_models(tmp_path: Path) -> None:
    """Stage 3's average (model/averaging.py): each checkpoint merged first, as the mean of B A over
    checkpoints is not mean(B) mean(A)."""
    model = tiny_sensevoice()
    inject_lora(model, SPEC)
    torch.save({k: p.detach().clone() for k, p in model.named_parameters() if not p.requires_grad},
               tmp_path / FROZEN_FILE)
    write_adapter_json(tmp_path, SPEC, ())
    merged = []
    for epoch in (1, 2):
        torch.manual_seed(epoch)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".lora_" in name:
                    p.normal_(0.0, 0.2)
        torch.save(model.state_dict(), tmp_path / f"model.pt.ep{epoch}")  # as the ddp engine saves
        merged.append(merge_lora_state(model.state_dict(), SPEC))
    average = average_fp32(tmp_path, ["model.pt.ep1", "model.pt.ep2"])
    assert average.keys() == merged[0].keys()
    for k in average:
        torch.testing.assert_close(average[k], (merged[0][k] + merged[1][k]) / 2, atol=1e-6, rtol=0)
    layer = "encoder.encoders.0.feed_forward.w_1"
    assert not torch.equal(merged[0][f"{layer}.weight"], merged[1][f"{layer}.weight"])
    # make_model_dir's finish_state_dict on the average leaves it as it is.
    again = finish_state_dict(tmp_path, average)
    assert all(torch.equal(again[k], v) for k, v in average.items())


def onnx_shape(graph_value: onnx.ValueInfoProto) -> tuple:
    dims = graph_value.type.tensor_type.shape.dim
    return tuple(d.dim_param or d.dim_value for d in dims)


def graph_signature(path: Path) -> dict:
    graph = onnx.load(str(path)).graph
    return {"inputs": [(v.name, v.type.tensor_type.elem_type, onnx_shape(v)) for v in graph.input],
            "outputs": [(v.name, v.type.tensor_type.elem_type, onnx_shape(v)) for v in graph.output],
            "ops": [n.op_type for n in graph.node],
            "initializers": sorted((t.name, tuple(t.dims)) for t in graph.initializer)}


def test_merged_model_exports_the_base_graph(tmp_path: Path) -> None:
    wavs = sorted(DEFAULT_WAV_DIR.glob("*.wav"))[::250][:10]
    if len(wavs) < 10:
        pytest.skip(f"{DEFAULT_WAV_DIR}: the bundled corpus is missing")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"key": w.stem, "source": str(w), "target": WORDS[int(w.stem[0])],
                                        "text_language": "<|en|>"}) + "\n" for w in wavs))
    base_dir = build_model_dir(tmp_path / "base", "SenseVoiceSmall", data)
    model = load_automodel(base_dir).model
    inject_lora(model, SPEC)
    randomize_adapters(model)
    merged_dir = Path(shutil.copytree(base_dir, tmp_path / "merged"))
    torch.save(merge_lora_state(model.state_dict(), SPEC), merged_dir / "model.pt")
    exports = {}
    for name, model_dir in (("base", base_dir), ("merged", merged_dir)):
        exports[name] = export_onnx(load_automodel(model_dir), tmp_path / f"onnx_{name}")[0]
    base, merged = graph_signature(exports["base"]), graph_signature(exports["merged"])
    assert merged == base
    # Same graph, other weights: the export did take the merged ones.
    weights = [{t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(p)).graph.initializer}
               for p in exports.values()]
    assert any(w.shape == weights[1][k].shape and (w != weights[1][k]).any() for k, w in weights[0].items())
    assert safe_load(merged_dir / "model.pt").keys() == safe_load(base_dir / "model.pt").keys()


def test_bare_names_mean_the_encoders_layers() -> None:
    """Paraformer's decoder has layers of the same names as its encoder's: a bare name adapts the encoder
    only; a dotted suffix or a regex reaches any layer."""
    from funasr_recipe.model.adapters import lora_layers

    block = lambda: torch.nn.ModuleDict({"w_1": torch.nn.Linear(4, 4), "w_2": torch.nn.Linear(4, 4)})  # noqa: E731
    model = torch.nn.ModuleDict({"encoder": torch.nn.ModuleList([block(), block()]),
                                 "decoder": torch.nn.ModuleList([block()])})
    assert lora_layers(model, ("w_1",)) == ["encoder.0.w_1", "encoder.1.w_1"]
    assert lora_layers(model, ("0.w_2",)) == ["encoder.0.w_2", "decoder.0.w_2"]
    assert lora_layers(model, (r"decoder\..*",)) == ["decoder.0.w_1", "decoder.0.w_2"]
