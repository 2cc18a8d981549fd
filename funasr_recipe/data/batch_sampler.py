"""Length-bucketed batches in a new order every epoch, the same number of steps on every rank.

funasr's default ``BatchSampler`` (``CustomDistributedBufferDynamicBatchSampler`` for token batches)
sorts buffers of ``sort_size x world_size`` utterances by length and yields their batches shortest
first. When the corpus fits in one buffer, every epoch therefore gives the same batches in the same
ascending-length order, and rank r always gets the r-th of each group of world-size neighbours.

``LengthBucketBatchSampler`` (registered in funasr's ``batch_sampler_classes`` table on import) sorts
the whole training set by length, with a random tiebreak and an optional small jitter of the sort key
so that the batches themselves change between epochs; cuts batches with funasr's budget; shuffles the
ORDER of those batches with a generator seeded by (seed, epoch) only, so that every rank computes the
same list; and deals them round-robin to the ranks. Select it with

  ./run.sh ... -- ++dataset_conf.batch_sampler=LengthBucketBatchSampler ++dataset_conf.seed=0

Replay: with ``replay_list`` (a jsonl, or a list of them, whose ``source`` values mark the
replay utterances of the training list, data/replay.py's write_train_list) and ``replay_ratio`` R, each
training epoch takes every new utterance plus R x as many replay ones drawn anew for that epoch
(data/replay.py: ReplaySelector); validation ignores both. Select it with

  ./run.sh ... -- ++dataset_conf.replay_list='[dump/replay_zh/data.jsonl]' ++dataset_conf.replay_ratio=1

It reads only ``len(dataset)`` and every ``dataset.get_source_len(i)``, or the dataset's
``source_lengths()`` array where it has one (with replay also every ``dataset.index_ds[i]["source"]``,
which parses every line of a mapped index: seconds per million utterances, fine for a fine-tuning set,
and the replay lists), once, at construction; it writes nothing.
The module has to be imported (``import funasr_recipe.data.batch_sampler``) before funasr builds
the dataloader, so that the name is in the table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
from funasr.register import tables

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.batching import cut_batches, split_to_multiple
from funasr_recipe.data.replay import ReplaySelector, replay_sources

log = logging.getLogger(__name__)


def dist_rank_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): explicit values win, else torch.distributed's when initialised, else (0, 1)."""
    if rank is None or world_size is None:
        initialised = dist.is_available() and dist.is_initialized()
        world_size = world_size if world_size is not None else (dist.get_world_size() if initialised else 1)
        rank = rank if rank is not None else (dist.get_rank() if initialised else 0)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    return rank, world_size


class BucketBatchSampler:
    """The batch sampler object funasr's trainer drives: ``set_epoch``, ``__iter__``, ``__len__``.

    Training (``is_training`` and ``shuffle``): sorted by length with a random tiebreak and a key
    jittered by up to +-``length_jitter`` (relative), cut into batches, batch order shuffled. All of it
    is drawn from ``numpy.random.default_rng([seed, epoch])``, so every rank builds the same list.
    Remainder rule: so that every rank takes the same number of optimiser steps without losing data,
    the batches with the most utterances are split in two (short half, long half) until their count is
    a multiple of world_size; nothing is dropped (dropping the remainder lost 7.5% of a 2,000-utterance
    corpus per epoch at 2 ranks). Fewer utterances than ranks is an error.

    Validation (``is_training=False``, or ``shuffle=False``): sorted by length (ties by index), no
    jitter, no shuffle, nothing dropped. The list is PADDED to a multiple of world_size by repeating
    its first batches, because funasr averages the validation loss over ranks and a rank without a
    batch would make the whole validation "unavailable"; a padded batch counts twice in that mean.

    Rank r takes batches r, r + W, r + 2W, ... of the list. ``start_step=k`` skips the first k of them,
    as funasr's sampler does when the trainer resumes in the middle of an epoch.

    Replay (training only): ``replay_list`` names the jsonl(s) whose sources are replay utterances; an
    epoch's utterances are then ReplaySelector(seed, replay_ratio)'s pick among the kept ones. funasr's
    dataset drops lines outside its length limits, so indices are matched by source, not by position.
    """

    def __init__(self, dataset: Any, batch_size: int, batch_type: str = "example", shuffle: bool = True,
                 is_training: bool = True, start_step: int = 0, seed: int = 0, length_jitter: float = 0.0,
                 batch_size_sample_max: int = 200, max_token_length: int | None = None,
                 rank: int | None = None, world_size: int | None = None,
                 replay_list: str | Path | Iterable[str | Path] | None = None,
                 replay_ratio: float = 1.0) -> None:
        if batch_type not in ("token", "example"):
            raise BadInputError(f"batch_type must be 'token' or 'example', got {batch_type!r}")
        if batch_size < 1 or batch_size_sample_max < 1:
            raise BadInputError(f"batch_size ({batch_size}) and batch_size_sample_max "
                                f"({batch_size_sample_max}) must be positive")
        if not 0.0 <= length_jitter < 1.0:
            raise BadInputError(f"length_jitter must be in [0, 1), got {length_jitter}")
        self.rank, self.world_size = dist_rank_world(rank, world_size)
        self.batch_size, self.batch_type = int(batch_size), batch_type
        self.max_utts = int(batch_size_sample_max)
        self.is_training = is_training
        self.shuffle = bool(shuffle) and is_training
        self.start_step = int(start_step)
        self.seed, self.length_jitter = int(seed), float(length_jitter)
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None
        lengths = source_lengths(dataset)
        self.lengths = lengths
        self.kept = np.arange(len(lengths))
        if max_token_length is not None:
            # funasr's sampler silently skips these; we say how many.
            self.kept = self.kept[lengths <= max_token_length]
            if (skipped := len(lengths) - len(self.kept)) > 0:
                log.warning("rank %d: %d of %d utterances have source_len > max_token_length %d and are "
                            "left out", self.rank, skipped, len(lengths), max_token_length)
        if len(self.kept) == 0:
            raise BadInputError(f"no utterances to batch (dataset of {len(lengths)}, "
                                f"max_token_length {max_token_length})")
        self._warned_oversized = False
        self.selector = None
        if replay_list and is_training:
            self.selector = ReplaySelector(replay_mask(dataset, replay_list), replay_ratio, self.seed)
            if self.rank == 0:
                log.info("replay: %d of %d training utterances are replay, ratio %g",
                         self.selector.is_replay.sum(), len(lengths), self.selector.ratio)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batches ``__iter__`` yields (funasr calls it before every epoch)."""
        self.epoch = int(epoch)

    def epoch_batches(self) -> list[list[int]]:
        """All ranks' batches of the current epoch, in the order they are dealt (rank r: r, r+W, ...)."""
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        kept = self.epoch_utterances()
        lengths = self.lengths[kept]
        if self.shuffle:
            rng = np.random.default_rng([self.seed, self.epoch])
            key = lengths * (1.0 + self.length_jitter * rng.uniform(-1.0, 1.0, len(lengths)))
            # lexsort: last key is primary; the random tiebreak reshuffles utterances of equal length.
            order = kept[np.lexsort((rng.random(len(lengths)), key))]
        else:
            order = kept[np.argsort(lengths, kind="stable")]
        batches, oversized = cut_batches(order, self.lengths, self.batch_size, self.batch_type, self.max_utts)
        if oversized and not self._warned_oversized:
            log.warning("rank %d: %d utterances are alone over batch_size %d (%s); each is a batch of one",
                        self.rank, oversized, self.batch_size, self.batch_type)
            self._warned_oversized = True
        n, w = len(batches), self.world_size
        if self.shuffle:
            batches = split_to_multiple(batches, w)
            batches = [batches[i] for i in rng.permutation(len(batches))]
        elif n % w:
            # Cyclic, so that even fewer batches than ranks gives every rank one.
            batches = batches + [batches[i % n] for i in range(w - n % w)]
        self._cache = (self.epoch, batches)
        return batches

    def epoch_utterances(self) -> np.ndarray:
        """Dataset indices of the current epoch: the kept ones, or with replay the selector's pick."""
        if self.selector is None:
            return self.kept
        picked = self.selector.epoch_indices(self.epoch, self.kept)
        if self.rank == 0:
            n_replay = int(self.selector.is_replay[picked].sum())
            log.info("epoch %d: %d new + %d replay utterances (ratio %g)", self.epoch, len(picked) - n_replay,
                     n_replay, self.selector.ratio)
        return picked

    def rank_batches(self) -> list[list[int]]:
        """This rank's batches of the current epoch, after skipping ``start_step``."""
        return self.epoch_batches()[self.rank :: self.world_size][self.start_step :]

    def __iter__(self):
        mine = self.rank_batches()
        if self.start_step:
            log.info("rank %d: epoch %d resumes after %d batches, %d left", self.rank, self.epoch,
                     self.start_step, len(mine))
            if not mine:
                log.warning("rank %d: start_step %d is past the last batch of epoch %d", self.rank,
                            self.start_step, self.epoch)
        return iter(mine)

    def __len__(self) -> int:
        # The trainer asks at every step (for its log line): served from the per-epoch cache.
        return len(self.rank_batches())


def source_lengths(dataset: Any) -> np.ndarray:
    """Every utterance's source_len, read once (every epoch needs them): the dataset's own array where it
    has one (data/feats_dataset.py over data/index_ds.py: the mapped lengths, no copy, no line parsed),
    else ``get_source_len(i)`` of each (funasr's datasets: a dict look-up, or a parse, per utterance)."""
    fast = getattr(dataset, "source_lengths", None)
    lengths = fast() if fast is not None else None
    if lengths is not None:
        return lengths
    return np.fromiter((dataset.get_source_len(i) for i in range(len(dataset))), dtype=np.int64,
                       count=len(dataset))


def replay_mask(dataset: Any, replay_list: str | Path | Iterable[str | Path]) -> np.ndarray:
    """is_replay[i] of every index of a funasr dataset: whether its source is one of the replay lists'.
    ValueError when the dataset has no replay utterance at all (the list is not the one it was built from)."""
    index_ds = getattr(dataset, "index_ds", None)
    if index_ds is None:
        raise BadInputError(f"replay_list needs a funasr dataset with an index_ds, got "
                            f"{type(dataset).__name__}")
    replay = replay_sources(replay_list)
    mask = np.fromiter((index_ds[i]["source"] in replay for i in range(len(dataset))), dtype=bool,
                       count=len(dataset))
    if not mask.any():
        raise BadInputError(f"none of the {len(replay)} replay sources of {replay_list} is in the "
                            f"training set of {len(dataset)} utterances: train on write_train_list's list "
                            "(data/replay.py)")
    return mask


@tables.register("batch_sampler_classes", "LengthBucketBatchSampler")
def length_bucket_batch_sampler(dataset: Any, **kwargs: Any) -> dict[str, Any]:
    """DataLoader keyword arguments, as funasr's ``BatchSampler`` entry returns them.

    ``kwargs`` is the whole ``dataset_conf`` (plus ``start_step`` for training, ``is_training=False``
    for validation). Used: batch_size, batch_type, shuffle, is_training, start_step, seed (default 0),
    length_jitter (default 0), batch_size_sample_max (200), max_token_length (only when set),
    rank / world_size (tests; torch.distributed's otherwise), and for the DataLoader num_workers (4),
    pin_memory (True), persistent_workers (True), prefetch_factor (2) with funasr's defaults.
    sort_size is accepted and ignored: the whole set is one bucket list. replay_list and replay_ratio
    (default 1) turn replay on for training (class docstring).
    """
    sampler = BucketBatchSampler(
        dataset,
        batch_size=kwargs["batch_size"],
        batch_type=kwargs.get("batch_type", "example"),
        shuffle=kwargs.get("shuffle", True),
        is_training=kwargs.get("is_training", True),
        start_step=kwargs.get("start_step", 0) or 0,
        seed=kwargs.get("seed", 0),
        length_jitter=kwargs.get("length_jitter", 0.0),
        batch_size_sample_max=kwargs.get("batch_size_sample_max", 200),
        max_token_length=kwargs.get("max_token_length"),
        rank=kwargs.get("rank"),
        world_size=kwargs.get("world_size", kwargs.get("num_replicas")),
        replay_list=kwargs.get("replay_list"),
        replay_ratio=float(kwargs.get("replay_ratio", 1.0)),
    )
    args: dict[str, Any] = {"batch_sampler": sampler, "num_workers": kwargs.get("num_workers", 4),
                            "pin_memory": kwargs.get("pin_memory", True)}
    if args["num_workers"] > 0:
        args["persistent_workers"] = kwargs.get("persistent_workers", True)
        args["prefetch_factor"] = kwargs.get("prefetch_factor", 2)
    return args
