"""train/grad_checkpoint.py: checkpointed encoders give the same loss and gradients and keep less.

Each tiny config's model is built as tests/helpers/configs.py builds it (funasr's AutoModel.build_model
without the hub) and trained on one random batch with and without ``enable()``, from the same weights
and seed. Memory is counted as autograd sees it: the bytes of the tensors saved for backward while the
encoder runs forward, plus the inputs a checkpoint keeps for its recomputation. Reads conf/tiny_*.yaml;
writes nothing.

  .venv/bin/python -m pytest tests/unit/train/test_grad_checkpoint.py -q -s   # -s prints the byte counts
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_leaves

from funasr_recipe.model.architecture import build_model, frontend_of, resolved
from funasr_recipe.train import grad_checkpoint
from tests.helpers.configs import random_batch

ROOT = Path(__file__).resolve().parents[3]
# Config -> the block lists enable() must find (funasr 1.4.16's attribute names).
EXPECTED = {
    "tiny_sensevoice": ["encoder.encoders0", "encoder.encoders", "encoder.tp_encoders"],
    "tiny_paraformer": ["encoder.encoders0", "encoder.encoders"],
    "tiny_conformer_ctc": ["encoder.encoders"],
}
# With checkpointing the encoder keeps only each block's input, plus what its input layer saves (not
# checkpointed: for the Conformer, conv2d subsampling's 128-channel maps at 4x the blocks' frame rate).
# Measured with torch 2.9.1 (encoder only, parameters left out, plain -> checkpointed): SenseVoice
# 8.22 MB -> 0.55 MB (7%), Paraformer 6.03 MB -> 0.41 MB (7%), Conformer-CTC 3.40 MB -> 1.46 MB (43%).
# The bounds leave about 1.4x margin for other torch versions' choices of what to save.
MAX_RATIO = {"tiny_sensevoice": 0.1, "tiny_paraformer": 0.1, "tiny_conformer_ctc": 0.6}


def setup(name: str) -> tuple[torch.nn.Module, Any, int, int]:
    """The config's model (seeded weights, train mode), its config, input size and vocabulary size."""
    cfg, vocab_size = resolved(ROOT / "conf" / f"{name}.yaml")
    torch.manual_seed(0)
    return build_model(cfg, vocab_size).train(), cfg, frontend_of(cfg).output_size(), vocab_size


class SavedBytes:
    """Bytes autograd keeps for backward while ``model.encoder`` runs forward: saved tensors and the
    inputs held by checkpoints, each storage once. Parameters are left out: they are kept either way."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen: dict[int, int] = {}
        self.inside = False

    def add(self, tensor: Any) -> None:
        if self.inside and isinstance(tensor, torch.Tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in self.params:
                self.seen[storage.data_ptr()] = storage.nbytes()

    @property
    def total(self) -> int:
        return sum(self.seen.values())

    @contextlib.contextmanager
    def counting(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[SavedBytes]:
        real = grad_checkpoint.checkpoint

        def counted_checkpoint(fn: Any, *args: Any, **kwargs: Any) -> Any:
            # Non-reentrant checkpoints keep their arguments for the recomputation, outside autograd's
            # saved tensors: count them here.
            for leaf in tree_leaves((args, kwargs)):
                self.add(leaf)
            return real(fn, *args, **kwargs)

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            self.add(tensor)
            return tensor

        def enter(*_: Any) -> None:
            self.inside = True

        def leave(*_: Any) -> None:
            self.inside = False

        monkeypatch.setattr(grad_checkpoint, "checkpoint", counted_checkpoint)
        hooks = [self.model.encoder.register_forward_pre_hook(enter),
                 self.model.encoder.register_forward_hook(leave)]
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield self
        finally:
            for hook in hooks:
                hook.remove()
            monkeypatch.setattr(grad_checkpoint, "checkpoint", real)


def train_step(model: torch.nn.Module, cfg: Any, input_size: int, vocab_size: int,
               monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """Loss, gradients and encoder saved bytes of one forward and backward, from a fixed seed."""
    batch = random_batch(cfg, input_size, vocab_size)  # fresh: SenseVoice adds to speech_lengths in place
    torch.manual_seed(123)  # dropout, SpecAug, SenseVoice's language-query draw
    with SavedBytes(model).counting(monkeypatch) as saved:
        loss = model(**batch)[0]
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, saved.total


@pytest.mark.parametrize("name", list(EXPECTED))
def test_same_loss_and_gradients_with_less_saved(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plain, cfg, input_size, vocab_size = setup(name)
    ckpt = copy.deepcopy(plain)
    assert grad_checkpoint.enable(ckpt) == EXPECTED[name]

    loss0, grads0, bytes0 = train_step(plain, cfg, input_size, vocab_size, monkeypatch)
    loss1, grads1, bytes1 = train_step(ckpt, cfg, input_size, vocab_size, monkeypatch)
    print(f"\n{name}: encoder saved for backward {bytes0} B plain, {bytes1} B checkpointed "
          f"({bytes1 / bytes0:.0%})")
    torch.testing.assert_close(loss1, loss0, rtol=1e-6, atol=1e-7)
    assert grads1.keys() == grads0.keys() and len(grads0) > 10
    for key, grad in grads0.items():
        torch.testing.assert_close(grads1[key], grad, rtol=1e-5, atol=1e-7, msg=key)
    assert bytes1 <= MAX_RATIO[name] * bytes0
    # Recomputation does not update BatchNorm's running statistics twice (the Conformer's conv module).
    for (key, buf0), buf1 in zip(plain.state_dict().items(), ckpt.state_dict().values(), strict=True):
        torch.testing.assert_close(buf1, buf0, rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_idempotent_keys_unchanged_and_plain_outside_training(name: str) -> None:
    model, cfg, input_size, vocab_size = setup(name)
    keys = list(model.state_dict())
    names = grad_checkpoint.enable(model)
    assert grad_checkpoint.enable(model) == names and list(model.state_dict()) == keys

    calls = 0
    block = model.get_submodule(names[-1])[0]
    real_forward = type(block).forward

    def counting(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        if self is block:
            calls += 1
        return real_forward(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(block), "forward", counting)
        model(**random_batch(cfg, input_size, vocab_size))[0].backward()
        assert calls == 2  # forward and one recomputation: wrapped once, not twice
        calls = 0
        model.eval()
        with torch.no_grad():
            model(**random_batch(cfg, input_size, vocab_size))
        assert calls == 1  # eval under no_grad: no checkpoint

    # A copy (EMA, averaging) runs its own weights and stays checkpointed.
    clone = copy.deepcopy(model)
    copied = clone.get_submodule(names[-1])[0]
    assert copied.forward.block is copied and grad_checkpoint.enable(clone) == names


def test_unsupported_model_is_refused() -> None:
    supported = "SenseVoiceEncoderSmall, SANMEncoder, ConformerEncoder"
    with pytest.raises(ValueError, match=rf"Sequential .*{supported}"):
        grad_checkpoint.enable(torch.nn.Sequential(torch.nn.Linear(4, 4)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_peak_memory_falls() -> None:
    """The tiny Conformer-CTC on a batch long enough for activations to dominate: the peak falls."""
    model, cfg, input_size, vocab_size = setup("tiny_conformer_ctc")
    model.cuda()
    frames = 1600  # 16 s of 10 ms frames, 400 after subsampling
    gen = torch.Generator().manual_seed(0)
    batch = {"speech": torch.randn(8, frames, input_size, generator=gen).cuda(),
             "speech_lengths": torch.full((8,), frames, device="cuda"),
             "text": torch.randint(4, vocab_size, (8, 20), generator=gen).cuda(),
             "text_lengths": torch.full((8,), 20, device="cuda")}

    def peak() -> int:
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        model(**batch)[0].backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    peak()  # warm-up: cuDNN/cuBLAS workspaces
    plain = peak()
    grad_checkpoint.enable(model)
    ckpt = peak()
    print(f"\ncuda peak over baseline: {plain} B plain, {ckpt} B checkpointed ({ckpt / plain:.0%})")
    assert ckpt < 0.7 * plain
