"""A process that must not outlive its parent: torchrun's workers.

torchrun starts each worker in a session of its own (``start_new_session=True`` in torch's
SubprocessHandler), so a signal to run.sh's process group never reaches them, and when torchrun itself is
killed with SIGKILL (the OOM killer, ``kill -9`` of the group, a scheduler's hard stop) they keep training
unseen: writing checkpoints, holding the GPU, leaving the other nodes waiting. On Linux the kernel can tie
a process to its parent's life (``prctl(PR_SET_PDEATHSIG)``), which needs no cooperation from torchrun.

  die_with_parent()   # first thing in local/train.py
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits; True where that is supported.

    SIGKILL, not SIGTERM: a worker blocked in a collective would not run a handler anyway.
    """
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died before the request was in place
        os.kill(os.getpid(), sig)
    return True
