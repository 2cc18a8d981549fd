"""Live training metrics: what the trainer hooks (funasr_recipe/compat/hooks.py) measure each step, served
to Prometheus from local rank 0 of each node and logged by global rank 0 as one ``train_metrics:`` JSON
line per funasr log interval (local/plot_training.py plots those).

Reads the GPUs' utilisation and memory through NVML (nvidia-ml-py) when there are GPUs; writes nothing
but the HTTP endpoint (``--metrics-port``; 0 = off) and the log lines.

  meter = StepMeter(); meter.batch(utterances=8, frames=6000); meter.step(data_wait_s=.01, step_s=.5)
  exporter = Exporter(port=9400, node_rank=0); exporter.update(meter.snapshot())
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
PREFIX = "funasr_train_"
# name -> help; every gauge the endpoint serves (the Grafana dashboard plots these, tests check it).
GAUGES = {
    "step": "optimizer steps so far (funasr's total step)",
    "epoch": "current epoch (0-based)",
    "loss": "training loss of the last logged step",
    "valid_loss": "validation loss of the last validation",
    "learning_rate": "learning rate of the first parameter group",
    "utterances_per_second": "utterances per second of this process over the last log interval",
    "frames_per_second": "10 ms input feature frames per second of this process over the last log interval",
    "data_wait_fraction": "fraction of step time spent waiting for the data loader, last log interval",
    "grad_norm": "global gradient norm of the last step (before clipping)",
    "allreduce_seconds": "time in gradient collectives (all-reduce, reduce-scatter, all-gather) "
                         "in the last step",
    "step_seconds": "mean wall time of one step over the last log interval",
}
GPU_GAUGES = {
    "gpu_memory_allocated_bytes": "memory allocated by this process's tensors (torch), its own GPU only",
    "gpu_memory_reserved_bytes": "memory reserved by this process's caching allocator (torch), its own GPU",
    "gpu_memory_used_bytes": "memory in use on the GPU, all processes (NVML)",
    "gpu_utilization_ratio": "fraction of the last sample period a kernel ran on the GPU (NVML)",
}


@dataclass
class StepMeter:
    """Accumulates per-step measurements over one log interval; ``snapshot()`` gives the interval's rates
    and starts the next one."""

    step: int = 0
    epoch: int = 0
    loss: float = math.nan
    valid_loss: float = math.nan
    learning_rate: float = math.nan
    grad_norm: float = math.nan
    allreduce_seconds: float = math.nan
    _utterances: int = 0
    _frames: int = 0
    _wait_s: float = 0.0
    _step_s: float = 0.0
    _steps: int = 0
    _since: float = field(default_factory=time.perf_counter)

    def batch(self, utterances: int, frames: int) -> None:
        self._utterances += utterances
        self._frames += frames

    def step_done(self, data_wait_s: float, step_s: float) -> None:
        """One step: the time its batch took to arrive and the whole step's time (data wait included)."""
        self._wait_s += max(0.0, data_wait_s)
        self._step_s += max(0.0, step_s)
        self._steps += 1

    def snapshot(self) -> dict[str, float]:
        now = time.perf_counter()
        wall = max(now - self._since, 1e-9)
        out = {"step": self.step, "epoch": self.epoch, "loss": self.loss, "valid_loss": self.valid_loss,
               "learning_rate": self.learning_rate, "utterances_per_second": self._utterances / wall,
               "frames_per_second": self._frames / wall,
               "data_wait_fraction": min(1.0, self._wait_s / self._step_s) if self._step_s > 0 else math.nan,
               "grad_norm": self.grad_norm, "allreduce_seconds": self.allreduce_seconds,
               "step_seconds": self._step_s / self._steps if self._steps else math.nan}
        self._utterances = self._frames = self._steps = 0
        self._wait_s = self._step_s = 0.0
        self._since = now
        return out


def log_line(snapshot: dict[str, float]) -> str:
    """The ``train_metrics:`` line's JSON (the names local/plot_training.py reads; NaN as null)."""
    import json

    def num(v: float, digits: int = 6) -> float | None:
        return (None if v is None or (isinstance(v, float) and not math.isfinite(v))
                else round(float(v), digits))

    return "train_metrics: " + json.dumps({
        "step": int(snapshot["step"]), "epoch": int(snapshot["epoch"]), "loss": num(snapshot["loss"]),
        "lr": num(snapshot["learning_rate"], 9), "utt_per_s": num(snapshot["utterances_per_second"], 2),
        "frames_per_s": num(snapshot["frames_per_second"], 1),
        "data_wait": num(snapshot["data_wait_fraction"], 4),
        "grad_norm": num(snapshot["grad_norm"], 4), "allreduce_s": num(snapshot["allreduce_seconds"], 5)})


class _Nvml:
    """Per-GPU utilisation and memory in use from NVML; nothing when there is no NVIDIA driver."""

    def __init__(self) -> None:
        self.handles = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as e:  # no driver, no library: NVML raises its own error types
            log.debug("no NVML (%s): GPU utilisation not served", e)

    def sample(self) -> list[tuple[float, float]]:
        out = []
        for h in self.handles:
            util = self.pynvml.nvmlDeviceGetUtilizationRates(h)
            out.append((util.gpu / 100.0, float(self.pynvml.nvmlDeviceGetMemoryInfo(h).used)))
        return out


class Exporter:
    """The Prometheus endpoint of one node (its own registry: nothing of the process's defaults)."""

    def __init__(self, port: int, node_rank: int, host: str = "0.0.0.0") -> None:
        from prometheus_client import CollectorRegistry, Gauge, Info, start_http_server

        self.registry = CollectorRegistry()
        self.gauges = {n: Gauge(PREFIX + n, h, registry=self.registry) for n, h in GAUGES.items()}
        self.gpu = {n: Gauge(PREFIX + n, h, ["gpu"], registry=self.registry) for n, h in GPU_GAUGES.items()}
        Info(PREFIX + "node", "which node serves this endpoint", registry=self.registry).info(
            {"node_rank": str(node_rank)})
        self.nvml = _Nvml()
        self.last_gpu_samples: list[tuple[float, float]] = []  # (utilisation, bytes used) per GPU
        self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        log.info("metrics: Prometheus endpoint on port %d (http://<this node>:%d/metrics)", port, port)

    def update(self, snapshot: dict[str, float]) -> None:
        for name, gauge in self.gauges.items():
            if name in snapshot and snapshot[name] is not None:
                gauge.set(snapshot[name])
        self._gpus()

    def set(self, name: str, value: float) -> None:
        self.gauges[name].set(value)

    def _gpus(self) -> None:
        import torch

        if torch.cuda.is_available():
            dev = torch.cuda.current_device()
            self.gpu["gpu_memory_allocated_bytes"].labels(str(dev)).set(torch.cuda.memory_allocated(dev))
            self.gpu["gpu_memory_reserved_bytes"].labels(str(dev)).set(torch.cuda.memory_reserved(dev))
        self.last_gpu_samples = self.nvml.sample()
        for i, (util, used) in enumerate(self.last_gpu_samples):
            self.gpu["gpu_utilization_ratio"].labels(str(i)).set(util)
            self.gpu["gpu_memory_used_bytes"].labels(str(i)).set(used)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# The cluster guides' monitoring table: what a healthy step looks like.
DATA_WAIT_MAX = 0.1       # above it the loader starves the accelerator
ALLREDUCE_MAX_S = 0.5     # gradient sync slower than this: the network (or a straggler) bounds the step
GPU_MEMORY_MAX = 0.85     # reserved above this: fragmentation, and a longer batch later, run out
GPU_UTIL_MIN = 0.7


def alerts(snapshot: dict[str, float], gpu_memory_fraction: float | None = None,
           gpu_utilisation: float | None = None) -> dict[str, str]:
    """The thresholds one log interval broke: {kind: what to do}."""
    out = {}
    wait = snapshot.get("data_wait_fraction", math.nan)
    if wait > DATA_WAIT_MAX:
        out["data_wait"] = (f"{100 * wait:.0f}% of step time waits for data (over "
                            f"{100 * DATA_WAIT_MAX:.0f}%): raise ++dataset_conf.num_workers, train on "
                            "stage-1 features (--feats-type fbank), or put dump/ on a faster disk")
    sync = snapshot.get("allreduce_seconds", math.nan)
    if sync > ALLREDUCE_MAX_S:
        out["allreduce"] = (f"gradient collectives took {sync:.2f} s in the last step (over "
                            f"{ALLREDUCE_MAX_S} s): check the preflight's bandwidth, "
                            "--comm-profile/--socket-ifname, or one slow node")
    if gpu_memory_fraction is not None and gpu_memory_fraction > GPU_MEMORY_MAX:
        out["gpu_memory"] = (f"{100 * gpu_memory_fraction:.0f}% of GPU memory reserved (over "
                             f"{100 * GPU_MEMORY_MAX:.0f}%): lower ++dataset_conf.batch_size or "
                             "--grad-checkpoint true")
    if gpu_utilisation is not None and gpu_utilisation < GPU_UTIL_MIN:
        out["gpu_util"] = (f"GPU busy {100 * gpu_utilisation:.0f}% of the time (under "
                           f"{100 * GPU_UTIL_MIN:.0f}%): data wait or communication holds it back")
    return out


def served_metric_names() -> list[str]:
    """Every metric name the endpoint serves (Info adds the _info suffix)."""
    return [PREFIX + n for n in (*GAUGES, *GPU_GAUGES)] + [PREFIX + "node_info"]
