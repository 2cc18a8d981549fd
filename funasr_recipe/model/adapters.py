"""Fine-tuning safeguards on the model: LoRA adapters on chosen Linear layers, frozen parameters, and what
turns a checkpoint of such a run back into a plain model of the base graph.

Reads  <exp>/adapter.json (the run's LoRA settings and frozen prefixes) and <exp>/frozen_fp32.pt (fp32
       copies of every parameter that did not train, written at training start by
       funasr_recipe/compat/finetune.py);
writes <exp>/adapter.json (``write_adapter_json``); everything else works on models and state dicts in
       memory.

Why peft and not funasr's own funasr/models/lora/layers.py: funasr's is a copy of Microsoft's loralib
that only some attention classes wire up through a ``lora_list`` argument, and SenseVoice's
MultiHeadedAttentionSANM accepts ``lora_list`` and ignores it, so it cannot adapt the model this recipe
fine-tunes most; its feed-forward layers have no hook at all. peft is maintained, injects into any
``nn.Linear`` of any ``nn.Module`` by name (``inject_adapter_in_model``: funasr's models are not Hugging
Face PreTrainedModels) and leaves the module tree otherwise as it was.

Merging is plain tensor maths (``W + alpha/rank * B @ A`` in fp32), so decoding, ONNX export, parity and
the package see the base graph with other weights and never import peft.

  spec = LoraSpec.with_defaults(rank=8, targets=("linear_q_k_v", "linear_out", "w_1", "w_2"))
  layers = inject_lora(model, spec)            # only the adapters train now
  plain = merge_lora_state(model.state_dict(), spec)
  state = finish_state_dict(Path("exp/x"), fp32_state_dict(Path("exp/x"), "model.pt.ep3"))
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from funasr_recipe.core.files import write_atomic
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.checkpoint import safe_load
from funasr_recipe.model.defaults import ALPHA_PER_RANK, DEFAULT_TARGETS

ADAPTER_FILE = "adapter.json"
FROZEN_FILE = "frozen_fp32.pt"
_LORA = ".lora_"       # peft's adapter tensors: <layer>.lora_A.<adapter>.weight, .lora_B., ...
_BASE = ".base_layer."  # peft keeps the wrapped Linear under <layer>.base_layer


@dataclass(frozen=True)
class LoraSpec:
    """One LoRA adapter per target layer: ``W x + alpha/rank * B A x``, A (rank x in), B (out x rank)."""

    rank: int
    alpha: float
    targets: tuple[str, ...]  # module-name suffixes (``w_1``) or regular expressions over the full name
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise BadInputError(f"LoRA rank must be at least 1 (got {self.rank})")
        if self.alpha <= 0:
            raise BadInputError(f"LoRA alpha must be positive (got {self.alpha})")
        if not self.targets or not all(t.strip() for t in self.targets):
            raise BadInputError(f"LoRA needs target module names (got {list(self.targets)})")
        if not 0.0 <= self.dropout < 1.0:
            raise BadInputError(f"LoRA dropout must be in [0, 1) (got {self.dropout})")

    @classmethod
    def with_defaults(cls, rank: int, targets: tuple[str, ...] = DEFAULT_TARGETS, alpha: float | None = None,
                      dropout: float = 0.0) -> LoraSpec:
        """A spec with alpha = 2 * rank unless given."""
        return cls(rank, ALPHA_PER_RANK * rank if alpha is None else float(alpha), tuple(targets), dropout)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


class AdapterInfo(NamedTuple):
    """What <exp>/adapter.json records: the LoRA spec (None: freezing only) and the frozen prefixes."""

    lora: LoraSpec | None
    frozen: tuple[str, ...]


def write_adapter_json(exp_dir: Path, spec: LoraSpec | None, frozen_prefixes: tuple[str, ...]) -> Path:
    """<exp>/adapter.json for ``spec`` and ``frozen_prefixes`` (atomically: other nodes may read it)."""
    path = Path(exp_dir) / ADAPTER_FILE
    data = {"lora": None if spec is None else {**asdict(spec), "targets": list(spec.targets)},
            "frozen": list(frozen_prefixes)}
    write_atomic(path, json.dumps(data, indent=2) + "\n")
    return path


def read_adapter_json(exp_dir: Path) -> AdapterInfo | None:
    """<exp>/adapter.json, or None when the run had neither adapters nor frozen parameters."""
    path = Path(exp_dir) / ADAPTER_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        lora = data.get("lora")
        spec = None if lora is None else LoraSpec(int(lora["rank"]), float(lora["alpha"]),
                                                  tuple(lora["targets"]), float(lora.get("dropout", 0.0)))
        return AdapterInfo(spec, tuple(data.get("frozen") or ()))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise BadInputError(f"{path}: not an adapter record of this recipe ({e})") from None


def _matches(name: str, target: str) -> bool:
    """A bare layer name (``w_1``) names that layer in the encoder's blocks, where adapters belong (in
    Paraformer the same names are also the decoder's); a dotted suffix (``ctc.ctc_lo``) or the full name
    names it anywhere, as in peft; else ``target`` is a regex over the full name."""
    if re.fullmatch(r"\w+", target):
        return name.startswith("encoder.") and name.endswith("." + target)
    if name == target or name.endswith("." + target):
        return True
    try:
        return re.fullmatch(target, name) is not None
    except re.error:
        return False


def _shortened(names: list[str], limit: int = 24) -> str:
    """Module names with block indices folded (``encoder.encoders.N.feed_forward.w_1``), at most ``limit``."""
    folded = sorted(dict.fromkeys(re.sub(r"\.\d+(?=\.|$)", ".N", n) for n in names))
    more = f", ... ({len(folded) - limit} more)" if len(folded) > limit else ""
    return ", ".join(folded[:limit]) + more


def lora_layers(model: torch.nn.Module, targets: tuple[str, ...]) -> list[str]:
    """Full names of the ``nn.Linear`` modules the targets name, in model order; a target that names none
    is a ValueError naming it and listing the Linear layers there are."""
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    chosen: set[str] = set()
    for target in targets:
        hits = [n for n in linears if _matches(n, target)]
        if not hits:
            raise BadInputError(f"LoRA target {target!r} names no nn.Linear of {type(model).__name__}; its "
                                f"Linear layers: {_shortened(linears)}")
        chosen.update(hits)
    return [n for n in linears if n in chosen]


def inject_lora(model: torch.nn.Module, spec: LoraSpec) -> list[str]:
    """Wrap the target layers of ``model`` (in place) in peft LoRA layers; afterwards only the adapters
    require gradients. Returns the adapted layers' names. B starts at zero: the output is unchanged."""
    layers = lora_layers(model, spec.targets)  # our message, before peft's own
    from peft import LoraConfig, inject_adapter_in_model

    # Full names, not the user's patterns: peft matches each exactly, and our check above already ran.
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=layers,
                        bias="none")
    inject_adapter_in_model(config, model)
    for name, param in model.named_parameters():
        param.requires_grad = _LORA in name
    return layers


def merge_lora_state(state: dict[str, torch.Tensor], spec: LoraSpec) -> dict[str, torch.Tensor]:
    """A plain state dict of the base graph from one of a LoRA model: for each adapted layer P,
    ``P.weight = P.base_layer.weight + alpha/rank * B @ A`` (fp32), ``P.bias`` from the base layer, and
    no ``lora_*`` key left."""
    prefixes = sorted({k.split(_LORA, 1)[0] for k in state if _LORA in k})
    merged: dict[str, torch.Tensor] = {}
    for p in prefixes:
        base = state.get(f"{p}.base_layer.weight")
        adapters = sorted(k for k in state if k.startswith(f"{p}.lora_A."))
        if base is None:
            raise ValueError(f"LoRA adapter {p} has no base weight {p}.base_layer.weight in the state")
        if len(adapters) != 1:
            raise ValueError(f"{p}: expected one LoRA adapter, found {adapters or 'no lora_A'}")
        a = state[adapters[0]].float()
        b = state.get(adapters[0].replace(".lora_A.", ".lora_B."))
        if b is None:
            raise ValueError(f"LoRA adapter {p} has lora_A but no lora_B")
        merged[f"{p}.weight"] = base.float() + spec.scaling * (b.float() @ a)
        if f"{p}.base_layer.bias" in state:
            merged[f"{p}.bias"] = state[f"{p}.base_layer.bias"]
    stray = [k for k in state if _BASE in k and k.split(_BASE, 1)[0] not in prefixes]
    if stray:
        raise ValueError(f"base-layer weights without an adapter: {', '.join(stray[:5])}")
    out = {k: v for k, v in state.items() if _LORA not in k and _BASE not in k}
    clash = sorted(set(out) & set(merged))
    if clash:
        raise ValueError(f"the state holds both adapted and plain weights of {', '.join(clash[:5])}")
    out.update(merged)
    return out


def frozen_names(model: torch.nn.Module, prefixes: tuple[str, ...]) -> list[str]:
    """Parameter names under ``prefixes`` (``k == p`` or ``k`` starts with ``p + "."``, funasr's rule)."""
    return [k for k, _ in model.named_parameters() if any(k == p or k.startswith(p + ".") for p in prefixes)]


def freeze_check(model: torch.nn.Module, prefixes: tuple[str, ...]) -> tuple[int, int]:
    """(trainable, total) parameter counts; a prefix that matches no parameter is a ValueError naming it
    and the model's top-level modules (funasr's freeze_param would silently freeze nothing)."""
    names = [k for k, _ in model.named_parameters()]
    for p in prefixes:
        if not frozen_names(model, (p,)):
            tops = ", ".join(dict.fromkeys(k.split(".", 1)[0] for k in names))
            raise BadInputError(f"freeze prefix {p!r} names no parameter of {type(model).__name__}; its "
                                f"top-level modules: {tops}")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def finish_state_dict(exp_dir: Path, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What every model dir written from ``exp_dir`` gets: unchanged without <exp>/adapter.json; with it,
    the frozen parameters from <exp>/frozen_fp32.pt, then the LoRA adapters merged. DeepSpeed keeps fp32
    masters only of what trains: its zero_to_fp32 of a ZeRO-1/2 checkpoint leaves frozen parameters out
    (0.19.8 records no frozen_param_shapes there), and the module copy beside it is bf16-rounded. A state
    that is already merged (an average of finished checkpoints) keeps its merged layers; the rest of its
    frozen parameters are set again (the same values)."""
    info = read_adapter_json(exp_dir)
    if info is None:
        return state
    path = Path(exp_dir) / FROZEN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing, but {Path(exp_dir) / ADAPTER_FILE} says the run froze "
                                "parameters; training writes it when it starts")
    frozen = safe_load(path)
    has_adapters = any(_LORA in k for k in state)
    out = dict(state)
    for k, v in frozen.items():
        if not has_adapters and _BASE in k and info.lora is not None:
            continue  # merged already: the layer's weight is base + adapter
        if k in out and out[k].shape != v.shape:
            raise BadInputError(f"{path}: frozen parameter {k} has shape {tuple(v.shape)}, the checkpoint "
                                f"{tuple(out[k].shape)}")
        out[k] = v.float()
    return merge_lora_state(out, info.lora) if info.lora is not None and has_adapters else out
