"""Freezing and LoRA through funasr's own trainer (funasr_recipe/compat/finetune.py): real one-epoch
fine-tunes on CPU (torchrun, 2 ranks, local.train) of a random-init tiny SenseVoiceSmall model dir, on 40
bundled digit clips through stage 1; and the hook's checks on a model without training.

Reads the bundled digit recordings; writes under pytest's tmp paths.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from funasr_recipe.compat.finetune import FinetuneOptions, prepare
from funasr_recipe.data.validate import validate_set
from funasr_recipe.model import adapters
from funasr_recipe.model.checkpoint import deepspeed_safe_globals, fp32_state_dict, safe_load
from funasr_recipe.model.model_dir import load_automodel, make_model_dir
from local import compute_fbank
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.helpers.model_dirs import build_model_dir
from tests.helpers.tiny_models import tiny_sensevoice
from tests.helpers.train_data import make_digit_subset
from tests.helpers.train_fixtures import free_port

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "conf" / "sensevoice_small.yaml"  # a fine-tune: the architecture comes from the model dir
# Steps big enough to move every trained weight; 3 steps per rank on 40 clips.
SHORT = ["++train_conf.max_epoch=1", "++dataset_conf.num_workers=0", "++dataset_conf.batch_size=500",
         "++scheduler_conf.warmup_steps=2", "++optim_conf.lr=0.002", "++train_conf.log_interval=1"]
LOG_LINE = re.compile(r"training ([\d,]+) of ([\d,]+) parameters \(([\d.]+)%\): (.*)")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/{train,dev} (40 and 10 clips), their stage-1 dump, and a random-init pretrained model dir."""
    if not DEFAULT_WAV_DIR.is_dir():
        pytest.skip(f"{DEFAULT_WAV_DIR}: the bundled corpus is missing")
    root = tmp_path_factory.mktemp("finetune")
    make_digit_subset(root / "data", per_digit_train=1, per_digit_dev=1)
    for name in ("train", "dev"):
        validate_set(root / "data" / name)
    pretrained = build_model_dir(root / "pre", "SenseVoiceSmall", root / "data" / "train" / "data.jsonl")
    common = ["--config", str(CONFIG), "--data-dir", str(root / "data"), "--dump-dir", str(root / "dump"),
              "--sets", "train dev", "--train-set", "train", "--pretrained-dir", str(pretrained)]
    assert compute_fbank.main(["work", *common, "--rank", "0"]) == 0
    assert compute_fbank.main(["merge", *common]) == 0
    return root


def extensions_dir() -> str:
    """DeepSpeed's CPU op (JIT-built, ~30 s) cached per Python environment: in the shared default dir a
    second venv on the machine rebuilds it on every switch (measured: 1-3 min a training run)."""
    if "TORCH_EXTENSIONS_DIR" in os.environ:
        return os.environ["TORCH_EXTENSIONS_DIR"]
    digest = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    return str(Path.home() / ".cache" / "torch_extensions" / f"venv-{digest}")


def train(root: Path, exp: str, engine: str, *options: str) -> tuple[Path, str]:
    """One epoch of local.train under torchrun (2 CPU ranks); returns the exp dir and the rank-0 log line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": extensions_dir()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), "-m", "local.train", "--config", str(CONFIG),
           "--exp-dir", str(root / exp), "--data-dir", str(root / "data"), "--dump-dir", str(root / "dump"),
           "--train-set", "train", "--valid-set", "dev", "--train-engine", engine,
           "--pretrained-dir", str(root / "pre" / "final"), "--oom-probe", "false", *options, "--", *SHORT]
    res = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-4000:]
    lines = [m for m in map(LOG_LINE.search, res.stdout.splitlines()) if m]
    assert len(lines) == 1, "one summary line, from rank 0"
    return root / exp, lines[0].group(0)


def deepspeed_module_copy(exp: Path, tag: str) -> dict[str, torch.Tensor]:
    """The bf16 module weights DeepSpeed saved beside its fp32 masters."""
    with torch.serialization.safe_globals(deepspeed_safe_globals()):
        return safe_load(exp / tag / "mp_rank_00_model_states.pt")["module"]


def check_frozen_run(root: Path, exp: Path, line: str) -> tuple[dict, dict]:
    """The model dir of a ``--freeze encoder`` run: frozen weights bit-identical to the pretrained ones,
    the rest trained; returns (pretrained, model dir) state dicts."""
    pre = safe_load(root / "pre" / "final" / "model.pt")
    trainable = sum(v.numel() for k, v in pre.items() if not k.startswith("encoder."))
    assert line == (f"training {trainable:,} of {sum(v.numel() for v in pre.values()):,} parameters "
                    f"({100 * trainable / sum(v.numel() for v in pre.values()):.2f}%): frozen: encoder")
    assert adapters.read_adapter_json(exp) == (None, ("encoder",))
    out = make_model_dir(exp, "model.pt.ep1", exp / "ep1_model")
    new = safe_load(out / "model.pt")
    assert new.keys() == pre.keys()
    frozen = [k for k in pre if k.startswith("encoder.")]
    assert frozen and all(torch.equal(new[k], pre[k]) for k in frozen)
    changed = [k for k in pre if not torch.equal(new[k], pre[k])]
    assert changed and not any(k.startswith("encoder.") for k in changed)
    assert "freeze_param" not in OmegaConf.load(out / "config.yaml")  # a later fine-tune must not inherit it
    return pre, new


@pytest.mark.slow  # trains under torchrun (the fast tier trains nothing)
@pytest.mark.parametrize("zero", [1, 2, 3])
def test_frozen_weights_stay_bit_identical_under_deepspeed_bf16(root: Path, zero: int) -> None:
    exp, line = train(root, f"exp_freeze_ds{zero}", "deepspeed", "--freeze", "encoder", "--ds-config",
                      str(ROOT / "ds_configs" / f"ds_stage{zero}_bf16.json"))
    pre, _ = check_frozen_run(root, exp, line)
    frozen = [k for k in pre if k.startswith("encoder.") and pre[k].is_floating_point()]
    if zero < 3:  # ZeRO-3 saves each rank's partition of the module, not a whole copy
        # Training really did not move them: DeepSpeed's bf16 module copy is the pretrained weight, rounded.
        module = deepspeed_module_copy(exp, "model.pt.ep1")
        assert all(torch.equal(module[k], pre[k].to(module[k].dtype)) for k in frozen)
    # ... and ZeRO-1's fp32 masters hold only what trained (why adapters.finish_state_dict needs
    # frozen_fp32.pt); ZeRO-2's and ZeRO-3's zero_to_fp32 add the frozen ones from the bf16 copy, rounded.
    masters = fp32_state_dict(exp, "model.pt.ep1")
    if zero == 1:
        assert not any(k.startswith("encoder.") for k in masters)
    else:
        rounded = {k: pre[k].to(torch.bfloat16).float() for k in frozen}
        assert all(torch.equal(masters[k], rounded[k]) for k in frozen if k in masters)
        assert zero == 2 or all(k in masters for k in frozen)


@pytest.mark.slow
def test_frozen_weights_stay_bit_identical_under_ddp(root: Path) -> None:
    exp, line = train(root, "exp_freeze_ddp", "ddp", "--freeze", "encoder")
    pre, _ = check_frozen_run(root, exp, line)
    # DDP keeps fp32 weights: the checkpoint itself holds the pretrained encoder, bit for bit.
    raw = fp32_state_dict(exp, "model.pt.ep1")
    assert all(torch.equal(raw[k], pre[k]) for k in pre if k.startswith("encoder."))


@pytest.mark.slow
def test_lora_model_dir_holds_the_merged_weights(root: Path) -> None:
    exp, line = train(root, "exp_lora_ds", "deepspeed", "--adapter", "lora", "--lora-rank", "4")
    spec = adapters.read_adapter_json(exp).lora
    assert spec == adapters.LoraSpec.with_defaults(4)
    assert re.search(r"LoRA rank 4 \(alpha 8\) on 12 layers$", line)
    masters = fp32_state_dict(exp, "model.pt.ep1")
    assert masters and all(".lora_" in k for k in masters)  # only the adapters trained
    out = make_model_dir(exp, "model.pt.ep1", exp / "ep1_model")
    pre, new = safe_load(root / "pre" / "final" / "model.pt"), safe_load(out / "model.pt")
    assert new.keys() == pre.keys()
    layers = {k.split(".lora_A.")[0] for k in masters if ".lora_A." in k}
    assert len(layers) == 12
    for k in pre:
        layer = k.rsplit(".", 1)[0]
        if layer in layers and k.endswith(".weight"):
            a, b = masters[f"{layer}.lora_A.default.weight"], masters[f"{layer}.lora_B.default.weight"]
            assert b.abs().max() > 0, f"{layer}: B did not train"
            torch.testing.assert_close(new[k], pre[k] + spec.scaling * b @ a, atol=1e-6, rtol=0)
            assert not torch.equal(new[k], pre[k])
        else:  # every weight without an adapter, and the adapted layers' biases: the pretrained ones
            assert torch.equal(new[k], pre[k]), k
    model = load_automodel(out).model  # funasr's AutoModel takes it as a plain SenseVoiceSmall
    assert type(model).__name__ == "SenseVoiceSmall"
    assert all(torch.equal(v, new[k]) for k, v in model.state_dict().items())


def test_a_freeze_prefix_that_names_nothing_stops_training(tmp_path: Path) -> None:
    opts = FinetuneOptions(freeze=("encoder.nope",), lora=None, exp_dir=tmp_path)
    with pytest.raises(ValueError, match="freeze prefix 'encoder.nope' names no parameter"):
        prepare(tiny_sensevoice(), opts, None, rank=0, resuming=False)
    # funasr's own freeze_param gets the same check (funasr alone would freeze nothing, silently).
    with pytest.raises(ValueError, match="freeze prefix 'encoders' names no parameter"):
        prepare(tiny_sensevoice(), FinetuneOptions((), None, tmp_path), "encoders", rank=0, resuming=False)
    assert not any(tmp_path.iterdir())


def test_records_are_written_once_and_a_resume_must_match(tmp_path: Path) -> None:
    lora = FinetuneOptions(freeze=(), lora=adapters.LoraSpec.with_defaults(2), exp_dir=tmp_path)
    model = tiny_sensevoice()
    line = prepare(model, lora, None, rank=0, resuming=False)
    assert line is not None and line.endswith("LoRA rank 2 (alpha 4) on 12 layers")
    frozen = safe_load(tmp_path / adapters.FROZEN_FILE)
    assert sorted(frozen) == sorted(k for k, p in model.named_parameters() if not p.requires_grad)
    assert all(v.dtype == torch.float32 for v in frozen.values())
    stamp = (tmp_path / adapters.FROZEN_FILE).stat().st_mtime_ns
    prepare(tiny_sensevoice(), lora, None, rank=0, resuming=True)  # the same settings: kept as they are
    assert (tmp_path / adapters.FROZEN_FILE).stat().st_mtime_ns == stamp
    other = FinetuneOptions(freeze=(), lora=adapters.LoraSpec.with_defaults(4), exp_dir=tmp_path)
    with pytest.raises(ValueError, match="resumes from model.pt, trained with other adapter"):
        prepare(tiny_sensevoice(), other, None, rank=0, resuming=True)
    plain = FinetuneOptions(freeze=(), lora=None, exp_dir=tmp_path)
    with pytest.raises(ValueError, match="resumes from model.pt, trained with other adapter"):
        prepare(tiny_sensevoice(), plain, None, rank=0, resuming=True)
    # A fresh run without either option in that exp dir: the stale records go (make_model_dir reads them).
    assert prepare(tiny_sensevoice(), plain, None, rank=0, resuming=False) is None
    assert adapters.read_adapter_json(tmp_path) is None and not (tmp_path / adapters.FROZEN_FILE).exists()
