"""Split work over every process of every node by rank alone: no process group, no messages.

Stages 1 and 3 are CPU-parallel and need no collective ops, so each process gets a global rank
(``node_rank * nj + i`` of ``nnodes * nj``) and takes its fixed slice: feature shards round robin,
test utterances longest first. Finished slices are marked with ``.done`` files (dist/markers.py) on the
shared filesystem, and node 0 waits for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from funasr_recipe.core.rejections import BadInputError

T = TypeVar("T")


def num_shards(n_items: int, shard_size: int) -> int:
    """How many shards of ``shard_size`` items hold ``n_items``."""
    return (n_items + shard_size - 1) // shard_size


def shard_size_for(n_items: int, max_size: int, world_size: int) -> int:
    """Items per shard: ``max_size``, or ceil(n_items / world_size) where fewer than ``world_size`` shards
    of ``max_size`` would leave a process without work (a demo set of 500 on 2 processes: 250). A large
    set keeps shards of ``max_size``, whatever the number of processes."""
    if max_size < 1 or world_size < 1:
        raise BadInputError(f"shard size {max_size} and world size {world_size} must be positive")
    return max(1, min(max_size, -(-n_items // world_size)))


def check_rank(rank: int, world_size: int) -> None:
    """ValueError unless 0 <= rank < world_size."""
    if not 0 <= rank < world_size:
        raise BadInputError(f"rank {rank} is not in 0..{world_size - 1}")


def my_shards(n_shards: int, rank: int, world_size: int) -> list[int]:
    """Shards of this rank: every ``world_size``-th one from ``rank`` (round robin keeps it balanced)."""
    check_rank(rank, world_size)
    return list(range(rank, n_shards, world_size))


def deal(items: Sequence[T], rank: int, world_size: int, size: Callable[[T], int],
         key: Callable[[T], str]) -> list[T]:
    """This rank's items: largest ``size`` first (ties by ``key``), dealt round robin, so that every rank
    gets the same mix of long and short work."""
    check_rank(rank, world_size)
    return sorted(items, key=lambda it: (-size(it), key(it)))[rank::world_size]
