"""Activation checkpointing for the encoders the recipe trains (``--grad-checkpoint true``).

Each block of the encoder's block lists keeps only its inputs during the forward pass and recomputes
its activations in the backward pass (``torch.utils.checkpoint``, non-reentrant, RNG state preserved:
dropout draws the same masks, so loss and gradients are those of the plain model). In eval mode or
under ``torch.no_grad`` the blocks run plainly. Supported: funasr's SenseVoiceEncoderSmall (SenseVoice),
SANMEncoder (Paraformer) and ConformerEncoder (the recipe's Conformer-CTC).

The blocks' ``forward`` is replaced on the instances; no wrapper module is inserted, so state_dict keys
stay those funasr loads and the ONNX export reads. Reads and writes no files: changes the model in place.

  from funasr_recipe.train.grad_checkpoint import enable; enable(model)  # before DDP/DeepSpeed wrap it
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from funasr_recipe.core.rejections import BadInputError

log = logging.getLogger(__name__)

# Encoder class name -> its block lists, in forward order. Matched by name, not by class: a released
# model loaded with trust_remote_code brings its own copy of SenseVoiceEncoderSmall (same structure,
# another module), and importing funasr's model modules here would cost seconds at every import.
BLOCK_LISTS: dict[str, tuple[str, ...]] = {
    "SenseVoiceEncoderSmall": ("encoders0", "encoders", "tp_encoders"),
    "SANMEncoder": ("encoders0", "encoders"),
    "ConformerEncoder": ("encoders",),
}


@contextlib.contextmanager
def _running_stats_kept(block: torch.nn.Module) -> Iterator[None]:
    """The recomputation must not update BatchNorm's running statistics a second time (the Conformer's
    convolution module has one): they are put back as the original forward left them. Switching
    tracking off instead would make batch_norm save two tensors fewer, which checkpoint refuses."""
    buffers = [buf for m in block.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
               for buf in (m.running_mean, m.running_var, m.num_batches_tracked) if buf is not None]
    kept = [buf.clone() for buf in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in zip(buffers, kept, strict=True):
                buf.copy_(value)


class _CheckpointedForward:
    """A block's ``forward``: its class's forward, under checkpointing while it trains with grad enabled.

    An object, not a closure: a deepcopy of the model (EMA, averaging) copies it bound to the copied
    block, and pickling the whole model (torch.save(model)) keeps it."""

    def __init__(self, block: torch.nn.Module) -> None:
        self.block = block

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        block = self.block
        forward = type(block).forward.__get__(block)
        if not (block.training and torch.is_grad_enabled()):
            return forward(*args, **kwargs)
        # Non-reentrant: the blocks take non-tensor arguments (None caches, a (x, pos_emb) tuple in the
        # Conformer) and return tuples holding None, which the reentrant variant cannot pass through.
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True,
                          context_fn=lambda: (contextlib.nullcontext(), _running_stats_kept(block)),
                          **kwargs)


def enable(model: torch.nn.Module) -> list[str]:
    """Checkpoint every block of each supported encoder in ``model``; returns the dotted names of the
    block lists now checkpointed (the same list on a repeated call, which wraps nothing more).

    Raises ValueError when ``model`` holds no supported encoder."""
    names: list[str] = []
    wrapped = kept = 0
    for prefix, module in model.named_modules():
        lists = BLOCK_LISTS.get(type(module).__name__)
        if lists is None:
            continue
        for attr in lists:
            blocks = getattr(module, attr, None)
            if blocks is None or len(blocks) == 0:  # e.g. SenseVoice with tp_blocks 0
                continue
            for block in blocks:
                if isinstance(block.__dict__.get("forward"), _CheckpointedForward):
                    kept += 1
                    continue
                block.forward = _CheckpointedForward(block)
                wrapped += 1
            names.append(f"{prefix}.{attr}" if prefix else attr)
    if not names:
        raise BadInputError(f"grad checkpointing: {type(model).__name__} holds none of the supported "
                            f"encoders ({', '.join(BLOCK_LISTS)})")
    log.info("grad checkpointing: %d encoder blocks in %s%s", wrapped + kept, ", ".join(names),
             f" ({kept} already checkpointed)" if kept else "")
    return names
