"""A collective bandwidth test over the backend training will use (nccl on GPUs, gloo on CPU), with every
process training would start (nnodes x nproc_per_node), before any training starts.

All-reduce of each size is timed as nccl-tests times it: algorithm bandwidth = bytes / time, bus
bandwidth = algbw x 2(n-1)/n (what each link carries in a ring all-reduce, so it compares with the link's
speed whatever n is); latency is the mean time of an 8-byte all-reduce.

Reads nothing; the workers meet through the preflight's TCPStore on node 0; global rank 0 puts the
result (JSON) in the store under RESULT_KEY.

  run_bandwidth(node_rank=0, nproc=8, nnodes=2, addr="10.0.0.1", port=29500, device="cuda",
                sizes_mib=[1, 16, 64, 256])
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

RESULT_KEY = "bandwidth/result"
LATENCY_BYTES = 8


def bus_factor(world: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for all-reduce."""
    return 2 * (world - 1) / world if world > 1 else 0.0


def _timed(dist, tensor, iters: int, sync) -> float:
    """Mean seconds of one all-reduce over iters, measured between barriers."""
    dist.barrier()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    sync()
    return (time.perf_counter() - start) / iters


def _worker(local_rank: int, node_rank: int, nproc: int, nnodes: int, addr: str, port: int, device: str,
            sizes_mib: list[int], timeout: float) -> None:
    import torch
    import torch.distributed as dist

    rank, world = node_rank * nproc + local_rank, nnodes * nproc
    raw = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout))
    store = dist.PrefixStore("bandwidth", raw)  # the process group's keys apart from the preflight's
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev, backend, sync = torch.device("cuda", local_rank), "nccl", torch.cuda.synchronize
    else:
        dev, backend, sync = torch.device("cpu"), "gloo", (lambda: None)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout))
    try:
        rows = []
        for mib in sizes_mib:
            x = torch.ones(mib * (1 << 20) // 4, dtype=torch.float32, device=dev)
            first = torch.tensor([_timed(dist, x, 1, sync)], device=dev)
            # Every rank must run the same number of all-reduces: decide from the slowest rank's time.
            dist.all_reduce(first, op=dist.ReduceOp.MAX)
            iters = max(2, min(20, round(0.5 / max(first.item(), 1e-6))))
            seconds = _timed(dist, x, iters, sync)
            algbw = mib * (1 << 20) / seconds / 1e9
            rows.append({"size_mib": mib, "iters": iters, "time_ms": round(seconds * 1e3, 3),
                         "algbw_gbps": round(algbw, 3), "busbw_gbps": round(algbw * bus_factor(world), 3)})
            del x
        small = torch.ones(LATENCY_BYTES // 4, dtype=torch.float32, device=dev)
        _timed(dist, small, 5, sync)
        latency_us = _timed(dist, small, 50, sync) * 1e6
        if rank == 0:
            raw.set(RESULT_KEY, json.dumps({"backend": backend, "world_size": world, "sizes": rows,
                                              "latency_us": round(latency_us, 1)}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_bandwidth(node_rank: int, nproc: int, nnodes: int, addr: str, port: int, device: str,
                  sizes_mib: list[int], timeout: float = 300.0) -> None:
    """Start this node's nproc workers and wait for them; raises if one fails."""
    import torch.multiprocessing as mp

    mp.start_processes(_worker, args=(node_rank, nproc, nnodes, addr, port, device, sizes_mib, timeout),
                       nprocs=nproc, join=True, start_method="spawn")


def bandwidth_table(result: dict) -> list[str]:
    """The result as log lines, nccl-tests' columns."""
    lines = [f"all-reduce over {result['backend']}, {result['world_size']} processes "
             f"(bus bandwidth = algbw x 2(n-1)/n, as nccl-tests):",
             f"  {'size':>9} {'time ms':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}"]
    for row in result["sizes"]:
        lines.append(f"  {row['size_mib']:>5} MiB {row['time_ms']:>10.3f} {row['algbw_gbps']:>11.3f} "
                     f"{row['busbw_gbps']:>11.3f}")
    lines.append(f"  latency of an {LATENCY_BYTES}-byte all-reduce: {result['latency_us']:.1f} us")
    return lines
