"""A small dynamic batcher: pieces of audio from requests that arrive together are decoded in one call.

One worker thread owns the model. A request's pieces (one, or several for long audio) enter a bounded
queue together or not at all (``QueueFull``: the service answers 503 with Retry-After); the worker
takes up to ``max_batch`` pieces, waiting at most ``max_wait_ms`` after the first for more, runs the
decode function on them, and completes each request once all its pieces are done. Reads and
writes nothing; ``on_batch`` reports each batch (size, seconds) to the metrics.

It waits for more only while a request is on its way (``expect()``: the app holds it while it reads
and decodes an upload): a fixed wait would add ``max_wait_ms`` to every request at low load, and at
fewer clients than ``max_batch`` the batch never fills, so every batch would wait it out (measured:
4 clients, max batch 8, 10 ms: 0.64x the throughput of no batching).

  batcher = DynamicBatcher(engine.decode, max_batch=8, max_wait_ms=10, queue_size=64)
  future = batcher.submit([piece1, piece2])   # concurrent.futures.Future -> [result1, result2]
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from funasr_recipe.core.rejections import BadInputError

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The queue cannot take the request's pieces now."""


@dataclass
class _Request:
    future: Future
    results: list[Any]
    left: int


@dataclass
class _Entry:
    item: Any
    request: _Request
    index: int
    queued_at: float = field(default_factory=time.monotonic)


class DynamicBatcher:
    """``fn(items) -> results`` (same length, same order) applied to batches of queued items."""

    def __init__(self, fn: Callable[[list[Any]], list[Any]], max_batch: int = 8, max_wait_ms: float = 10.0,
                 queue_size: int = 64, on_batch: Callable[[int, float], None] | None = None) -> None:
        if max_batch < 1 or queue_size < max_batch:
            raise BadInputError(f"max_batch {max_batch} must be >= 1 and <= queue_size {queue_size}")
        self.fn, self.max_batch, self.max_wait = fn, max_batch, max_wait_ms / 1000.0
        self.queue_size, self.on_batch = queue_size, on_batch
        self._queue: deque[_Entry] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._expected = 0  # requests being read or decoded that will submit soon
        self._thread = threading.Thread(target=self._run, name="batcher", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Pieces waiting (not counting the batch being decoded)."""
        return len(self._queue)

    @contextmanager
    def expect(self) -> Iterator[None]:
        """Tell the worker that a request is on its way for the block (it may wait for it)."""
        with self._cond:
            self._expected += 1
        try:
            yield
        finally:
            with self._cond:
                self._expected -= 1
                self._cond.notify()

    def submit(self, items: Sequence[Any]) -> Future:
        """Queue a request's items; its future gets their results in order. Raises QueueFull."""
        request = _Request(Future(), [None] * len(items), len(items))
        if not items:
            request.future.set_result([])
            return request.future
        with self._cond:
            if self._stopped:
                raise RuntimeError("the batcher is stopped")
            if len(self._queue) + len(items) > self.queue_size:
                raise QueueFull(f"{len(self._queue)} pieces queued, room for {self.queue_size}")
            self._queue.extend(_Entry(item, request, i) for i, item in enumerate(items))
            self._cond.notify()
        return request.future

    def close(self, timeout: float = 10.0) -> None:
        """Finish the queued work, then stop the worker."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout)

    def _take(self) -> list[_Entry] | None:
        with self._cond:
            while not self._queue:
                if self._stopped:
                    return None
                self._cond.wait()
            # Requests on their way: wait for them until the batch is full or the oldest piece has
            # waited max_wait.
            deadline = self._queue[0].queued_at + self.max_wait
            while len(self._queue) < self.max_batch and self._expected > 0 and not self._stopped:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            start = time.perf_counter()
            try:
                results = self.fn([e.item for e in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"decode returned {len(results)} results for {len(batch)} pieces")
            except Exception as e:  # the requests of this batch fail; the service goes on
                log.exception("decoding a batch of %d failed", len(batch))
                for entry in batch:
                    if not entry.request.future.done():
                        entry.request.future.set_exception(e)
                continue
            if self.on_batch is not None:
                self.on_batch(len(batch), time.perf_counter() - start)
            for entry, result in zip(batch, results, strict=True):
                request = entry.request
                request.results[entry.index] = result
                request.left -= 1
                if request.left == 0 and not request.future.done():
                    request.future.set_result(request.results)
