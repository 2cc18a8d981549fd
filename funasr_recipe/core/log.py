"""Logging shared by every program: node and rank in each line, and a progress meter.

Rank and node come from torchrun's variables (RANK, LOCAL_RANK) or run.sh's (NODE_RANK), so a line
from a multi-node job says where it was written:

  2026-11-30 15:04:05 INFO [node0 rank1] [compute_fbank.py:88] dump/train: 1200/2500 utt ...
"""

from __future__ import annotations

import logging
import os
import sys
import time


def log_format() -> str:
    """The format of every log line: time, level, node and rank, file:line, message (also handed to the
    funasr trainer's Hydra logging, so that its lines look the same)."""
    node = os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0"))
    rank = os.environ.get("RANK", "0")
    return f"%(asctime)s %(levelname)s [node{node} rank{rank}] [%(filename)s:%(lineno)d] %(message)s"


def setup_logging(level: int = logging.INFO) -> logging.Logger:
    """Configure the root logger once (to stderr) and return it."""
    logging.basicConfig(level=level, format=log_format(), datefmt="%Y-%m-%d %H:%M:%S", stream=sys.stderr,
                        force=True)
    return logging.getLogger()


class Progress:
    """Periodic progress line with count, rate and ETA; quiet between intervals.

    Log lines rather than a tqdm bar because stage logs are files (run.sh tees them), where a
    redrawn bar turns into thousands of carriage returns.
    """

    def __init__(self, desc: str, total: int | None, unit: str = "utt", interval: float = 10.0,
                 logger: logging.Logger | None = None) -> None:
        self.desc, self.total, self.unit, self.interval = desc, total, unit, interval
        self.log = logger or logging.getLogger(__name__)
        self.count = 0
        self.start = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        """Count n more items; log when the interval has passed."""
        self.count += n
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self.log.info(self._line(now))

    def close(self) -> float:
        """Log the final line; returns the elapsed seconds."""
        now = time.monotonic()
        self.log.info(self._line(now) + " (done)")
        return now - self.start

    def _line(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        rate = self.count / elapsed
        if self.total:
            eta = (self.total - self.count) / rate if rate > 0 else float("inf")
            return (f"{self.desc}: {self.count}/{self.total} {self.unit} "
                    f"({rate:.1f} {self.unit}/s, elapsed {elapsed:.0f}s, ETA {eta:.0f}s)")
        return f"{self.desc}: {self.count} {self.unit} ({rate:.1f} {self.unit}/s, elapsed {elapsed:.0f}s)"
