"""The multi-node communication budget of DeepSpeed ZeRO-1 (or 2) training, on paper: what each optimizer
step sends over a node's link, how long that takes at 10/100/200 Gb/s, and how many nodes still pay.

What DeepSpeed 0.19.8 sends (deepspeed/runtime/zero/stage_1_and_2.py, the optimizer a bf16 ZeRO-1/2 config
gets), with P the trainable parameters and b the bytes of the communication dtype (bf16: 2):
  gradients   at the accumulation boundary (ZeRO-1; ZeRO-2 at every micro-batch), ``average_tensor``
              all-reduces each bucket: with ``use_multi_rank_bucket_allreduce`` (its default) even under
              ``reduce_scatter: true``; ring all-reduce: 2(n-1)/n x P x b per link. Without it, one
              ``dist.reduce`` to each partition's owner: (n-1)/n x P x b, as a reduce-scatter.
  parameters  after the step, ``all_gather_dp_groups`` gathers the updated bf16 partitions: (n-1)/n x P x b.
n is every process (nodes x GPUs a node). A ring's inter-node link carries what each rank sends, so the
time is bytes / the node's inter-node bandwidth (all its NICs together): nccl-tests' bus bandwidth, which
run.sh's preflight bandwidth test reports in exp/<tag>/preflight.json (--preflight-json reads it). One node
talks over NVLink or PCIe, taken here as free: a node count's speedup is against one node.

Under DeepSpeed, accumulation is the JSON's ``gradient_accumulation_steps`` (funasr's trainer calls
engine.backward and engine.step every batch; its ``train_conf.accum_grad`` is read only on its DDP path):
k micro-batches of compute per optimizer step against one ZeRO-1 exchange. With --step-seconds T (one
micro-batch's forward and backward on one GPU) the speedup of N nodes is N kT / (kT + c), c the exchange
above; the range printed runs from no overlap to the gradients' reduce hidden entirely behind the
backward (``overlap_comm: true``), leaving the gather. Without it, the compute per optimizer step that
the speedups a Conformer cluster guide measured (GUIDE) imply is printed instead: with less compute a
step, more nodes pay less than they did there.

Reads --config (+ overrides after --; its model built on the meta device, no weights, no hub:
funasr_recipe/model/architecture.py) or takes --params, and --ds-config; writes nothing but its tables.

  .venv/bin/python -m bench.bench_comm --config conf/sensevoice_small.yaml \\
      [--ds-config ds_configs/ds_stage1_bf16.json] [--gpus-per-node 8] [--nodes 1,2,4,8] \\
      [--gbps 10,100,200] [--accum-grad 4] [--step-seconds 0.5] [--preflight-json exp/x/preflight.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main, split_overrides
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.dist.bandwidth import bus_factor
from recipes.common import split_list

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
GUIDE = {2: 1.85, 4: 3.33}  # nodes -> speedup over one node, as the Conformer cluster guide measured it
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class Zero:
    """What the DeepSpeed JSON decides about the exchange."""

    stage: int
    dtype: str  # the gradients' and parameters' communication dtype
    accum: int  # gradient_accumulation_steps: micro-batches per optimizer step
    allreduce: bool  # gradients all-reduced (2(n-1)/n) rather than reduced to their owners ((n-1)/n)

    @property
    def bytes_per_value(self) -> int:
        return DTYPE_BYTES[self.dtype]


def zero_of(ds_config: Path) -> Zero:
    """The exchange a DeepSpeed JSON sets up; BadInputError for a ZeRO stage this budget does not model."""
    conf = json.loads(ds_config.read_text(encoding="utf-8"))
    zero = conf.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0))
    if stage not in (1, 2):
        raise BadInputError(f"{ds_config}: ZeRO stage {stage}; the budget models stages 1 and 2 (stage 3 "
                            "gathers the parameters in every forward and backward)")
    dtype = "bf16" if conf.get("bf16", {}).get("enabled") else "fp16" if conf.get("fp16", {}).get("enabled") \
        else "fp32"
    comm = str(conf.get("communication_data_type") or "").lower()  # DeepSpeed's override, as it reads it
    dtype = comm if comm in DTYPE_BYTES else dtype
    allreduce = zero.get("use_multi_rank_bucket_allreduce", True) or not zero.get("reduce_scatter", True)
    return Zero(stage, dtype, int(conf.get("gradient_accumulation_steps", 1)), bool(allreduce))


def step_bytes(params: int, ranks: int, zero: Zero) -> tuple[float, float]:
    """(gradient bytes, parameter bytes) that one node's link carries per optimizer step, ``ranks``
    processes in all."""
    size = params * zero.bytes_per_value
    reduce = (bus_factor(ranks) if zero.allreduce else bus_factor(ranks) / 2) * size
    if zero.stage == 2:  # ZeRO-2 reduces the gradients of every micro-batch, not once per step
        reduce *= zero.accum
    return reduce, bus_factor(ranks) / 2 * size


def seconds(nbytes: float, gbps: float) -> float:
    """Time to move ``nbytes`` at ``gbps`` gigabits per second."""
    return nbytes * 8 / (gbps * 1e9)


def speedup(nodes: int, compute: float, exchange: float) -> float:
    """N nodes against one: ``compute`` seconds per optimizer step, plus ``exchange`` on N nodes only."""
    return nodes * compute / (compute + exchange) if nodes > 1 else 1.0


def needed_compute(nodes: int, target: float, exchange: float) -> float:
    """Compute per optimizer step at which N nodes reach ``target`` over one, with no overlap."""
    return exchange * target / (nodes - target)


def tables(params: int, zero: Zero, gpus: int, nodes: list[int], gbps: list[float],
           step_s: float | None) -> str:
    """The budget as markdown: bytes and time per step, then speedups or the compute they need."""
    heads = " | ".join(f"{g:g} Gb/s" for g in gbps)
    rule = "|---:|---:|---:|" + "---:|" * len(gbps)
    reduce_how = "all-reduce 2(n-1)/n" if zero.allreduce else "reduce to owners (n-1)/n"
    lines = [f"{params:,} parameters; ZeRO-{zero.stage}, {zero.dtype} ({zero.bytes_per_value} bytes a "
             f"value), {zero.accum} micro-batch(es) per optimizer step, {gpus} GPUs a node", "",
             f"Per optimizer step, over each node's link: gradients {reduce_how} x P x b"
             f"{' x k' if zero.stage == 2 else ''}, parameters all-gather (n-1)/n x P x b", "",
             f"| nodes | GPUs | GB per step (gradients + parameters) | {heads} |", rule]
    exchange = {}
    for n in nodes:
        grad, gather = step_bytes(params, n * gpus, zero)
        exchange[n] = [(seconds(grad + gather, g), seconds(gather, g)) for g in gbps]
        if n == 1:
            lines.append(f"| 1 | {gpus} | inside the node | " + " | ".join("-" for _ in gbps) + " |")
            continue
        volume = f"{(grad + gather) / 1e9:.3f} ({grad / 1e9:.3f} + {gather / 1e9:.3f})"
        lines.append(f"| {n} | {n * gpus} | {volume} | "
                     + " | ".join(f"{full:.3f} s" for full, _ in exchange[n]) + " |")
    lines.append("")
    if step_s is not None:
        compute = zero.accum * step_s
        lines += [f"Speedup over one node, {step_s:g} s per micro-batch ({compute:g} s of compute per step), "
                  "no overlap - gradient reduce hidden:", "", f"| nodes | GPUs | guide | {heads} |", rule]
        for n in nodes:
            cells = [f"{speedup(n, compute, full):.2f}x - {speedup(n, compute, gather):.2f}x"
                     for full, gather in exchange[n]]
            lines.append(f"| {n} | {n * gpus} | {GUIDE.get(n, '-')}{'x' if n in GUIDE else ''} | "
                         + " | ".join(cells) + " |")
    else:
        lines += ["Compute per optimizer step (k micro-batches) for the guide's speedup, no overlap:", "",
                  f"| nodes | GPUs | guide | {heads} |", rule]
        for n in [n for n in nodes if n in GUIDE]:
            cells = [f"{needed_compute(n, GUIDE[n], full):.3f} s" for full, _ in exchange[n]]
            lines.append(f"| {n} | {n * gpus} | {GUIDE[n]}x | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def count_params(config: Path, overrides: list[str]) -> int:
    """The trainable parameters of the config's model, built on the meta device."""
    from funasr_recipe.model.architecture import build_model, parameter_count, resolved

    cfg, vocab_size = resolved(config, overrides)
    return parameter_count(build_model(cfg, vocab_size, device="meta"))


def measured_gbps(preflight_json: Path) -> float:
    """The bus bandwidth of the preflight's largest all-reduce, in Gb/s (it records GB/s)."""
    result = json.loads(preflight_json.read_text(encoding="utf-8")).get("bandwidth")
    if not result or not result.get("sizes"):
        raise BadInputError(f"{preflight_json}: no bandwidth test recorded (run.sh --stage -1 on every node)")
    return max(result["sizes"], key=lambda r: r["size_mib"])["busbw_gbps"] * 8


def run(args: argparse.Namespace, overrides: list[str]) -> None:
    zero = zero_of(args.ds_config)
    if args.accum_grad is not None:
        zero = Zero(zero.stage, zero.dtype, args.accum_grad, zero.allreduce)
    params = args.params if args.params is not None else count_params(args.config, overrides)
    gbps = [float(g) for g in split_list(args.gbps)]
    if args.preflight_json is not None:
        gbps.append(round(measured_gbps(args.preflight_json), 1))
    nodes = [int(n) for n in split_list(args.nodes)]
    if any(n < 1 for n in nodes) or any(g <= 0 for g in gbps) or args.gpus_per_node < 1 or zero.accum < 1:
        raise BadInputError("--nodes, --gbps, --gpus-per-node and the accumulation must be positive")
    source = f"--params {params}" if args.params is not None else str(args.config)
    print(f"{source}, {args.ds_config}\n")
    print(tables(params, zero, args.gpus_per_node, nodes, gbps, args.step_seconds))


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = program_parser(__doc__)
    parser.add_argument("--config", type=Path, default=ROOT / "conf" / "sensevoice_small.yaml")
    parser.add_argument("--params", type=int, help="the trainable parameter count (instead of --config)")
    parser.add_argument("--ds-config", type=Path, default=ROOT / "ds_configs" / "ds_stage1_bf16.json")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nodes", default="1,2,4,8")
    parser.add_argument("--gbps", default="10,100,200", help="inter-node bandwidths of a node, Gb/s")
    parser.add_argument("--preflight-json", type=Path, help="exp/<tag>/preflight.json: adds its measured bus "
                        "bandwidth as a column")
    parser.add_argument("--accum-grad", type=int, help="micro-batches per optimizer step (default: the "
                        "JSON's gradient_accumulation_steps)")
    parser.add_argument("--step-seconds", type=float, help="one micro-batch's forward and backward on one "
                        "GPU, seconds: prints speedups")
    args = parser.parse_args(own)
    setup_logging()
    return run_main(lambda: run(args, overrides), log)


if __name__ == "__main__":
    sys.exit(main())
