"""ZeRO-Offload of the optimizer under funasr 1.4.16's trainer: DeepSpeed's CPU Adam in place of the
torch Adam/AdamW funasr builds, with the run's own ``optim_conf``.

funasr's ``warp_optim_scheduler`` builds ``optim`` (``optim_conf``'s settings) from its table
``funasr.optimizers.optim_classes`` and hands it to ``deepspeed.initialize``. With
``zero_optimization.offload_optimizer`` DeepSpeed refuses a torch optimizer: stepping the fp32 master
weights on the CPU is the job of its CPU Adam, a vectorised C++ op
(``zero_force_ds_cpu_optimizer: false`` would accept it all the same). The JSON's own ``optimizer``
section is no way out: funasr then drops its optimizer and with it ``optim_conf``, so ``++optim_conf.lr``
would be silently ignored. So for the length of that call the table maps ``adam``/``adamw`` to
``DeepSpeedCPUAdam`` (``adamw_mode`` for adamw), given the torch class's defaults overlaid with
``optim_conf``: the same update rule and settings, run by DeepSpeed's op. That op (cpu_adam) is built by
DeepSpeed with g++ on first use (JIT, cached in $TORCH_EXTENSIONS_DIR, which path.sh puts in the venv), on
GPU nodes and on CPU alike.

A JSON with its own ``optimizer`` section, or without offload, leaves funasr's call alone.

Reads the run's DeepSpeed JSON; writes nothing (a log line).

  install()                       # once per rank, before funasr's train_ds.main_hydra
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from funasr_recipe.compat.patching import replaced, wrap_method
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.train.zero import ZeroSettings, read_ds_config

log = logging.getLogger(__name__)
# funasr's optimizer name -> (the torch class it builds, DeepSpeedCPUAdam's adamw_mode)
CPU_ADAM = {"adam": (torch.optim.Adam, False), "adamw": (torch.optim.AdamW, True)}
# The settings both take; torch's others (foreach, fused, ...) choose an implementation, and maximize
# or capturable have no CPU Adam counterpart.
SETTINGS = ("lr", "betas", "eps", "weight_decay", "amsgrad")
_installed = False


def cpu_adam_factory(name: str) -> Callable[..., torch.optim.Optimizer]:
    """A stand-in for funasr's ``optim_classes[name]``: DeepSpeedCPUAdam with the torch class's
    defaults under the given settings; a setting CPU Adam lacks is a BadInputError naming it."""
    torch_class, adamw_mode = CPU_ADAM[name]
    defaults = {k: p.default for k, p in inspect.signature(torch_class).parameters.items() if k in SETTINGS}

    def build(params: Any, **conf: Any) -> torch.optim.Optimizer:
        if unknown := sorted(set(conf) - set(SETTINGS)):
            raise BadInputError(f"optim_conf {', '.join(unknown)}: DeepSpeed's CPU Adam, which runs {name} "
                                f"when the optimizer is offloaded, takes only {', '.join(SETTINGS)}")
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # here: its import builds the op (g++) on first use

        settings = {**defaults, **conf}
        settings["betas"] = tuple(settings["betas"])  # a YAML list
        return DeepSpeedCPUAdam(params, adamw_mode=adamw_mode, **settings)

    return build


@contextlib.contextmanager
def cpu_optimizer(name: str) -> Iterator[None]:
    """funasr's optimizer table with ``name`` built as DeepSpeed's CPU Adam, for the block."""
    import funasr.optimizers

    table = {**funasr.optimizers.optim_classes, name: cpu_adam_factory(name)}
    with replaced(funasr.optimizers, "optim_classes", table):
        yield


def install() -> None:
    """Wrap the Trainer's warp_optim_scheduler (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    from funasr.train_utils.trainer_ds import Trainer

    @wrap_method(Trainer, "warp_optim_scheduler")
    def _(original, self, model, **kwargs):
        conf = read_ds_config(self.deepspeed_config) if self.use_deepspeed else {}
        if not ZeroSettings.of(conf).offload_optimizer or "optimizer" in conf:
            return original(self, model, **kwargs)
        name = kwargs.get("optim", "adam")
        if name not in CPU_ADAM:
            raise BadInputError(f"{self.deepspeed_config} offloads the optimizer, which needs DeepSpeed's "
                                f"CPU Adam; optim {name} has none: use optim adam or adamw, or a config "
                                "without offload_optimizer")
        log.info("optimizer offloaded to CPU memory: funasr's %s runs as DeepSpeed's CPU Adam with "
                 "optim_conf %s", name, dict(kwargs.get("optim_conf") or {}))
        with cpu_optimizer(name):
            return original(self, model, **kwargs)
