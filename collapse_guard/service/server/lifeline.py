"""A worker ends when the server that started it dies.

BentoML's process manager (circus) starts every worker in a session of its own
(``setsid``), so a SIGKILL to ``bentoml serve``, or to its whole process group, left the
workers running as orphans (parent pid 1), still answering on the socket they inherited.
A worker therefore calls :func:`end_with_parent` at start-up, which arms two things:

- on Linux, ``prctl(PR_SET_PDEATHSIG, SIGTERM)``: the kernel sends the worker SIGTERM the
  moment its parent dies, and the worker stops as it does on any SIGTERM (uvicorn closes
  the socket, BentoML runs the shutdown hooks: the reload file is removed);
- everywhere, a daemon thread that compares ``os.getppid()`` with the parent seen at
  start every ``WATCH_SECONDS``: a changed parent sends that SIGTERM itself where prctl is
  not available, and ends the process with ``os._exit`` after ``GRACE_SECONDS`` if the
  clean stop hangs (a request that never ends, say).

The parent is circus's arbiter, which spawns from the thread that runs it (the main thread
under ``bentoml serve``), so the death signal fires only when the server itself dies.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading

__all__ = ["GRACE_SECONDS", "WATCH_SECONDS", "end_with_parent"]

log = logging.getLogger(__name__)

WATCH_SECONDS = 0.5  # one getppid() (a syscall, < 1 us) per look
GRACE_SECONDS = 5.0  # a clean stop takes ~1-2 s here; after this the worker just exits

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_armed = False


def _death_signal() -> bool:
    """Ask Linux for SIGTERM when the parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int, signalled: bool) -> None:
    stop = threading.Event()
    while os.getppid() == parent:
        stop.wait(WATCH_SECONDS)
    log.error("the server (pid %d) is gone; this worker (pid %d) stops", parent, os.getpid())
    if not signalled:  # prctl did not: the same clean stop, asked by ourselves
        os.kill(os.getpid(), signal.SIGTERM)
    stop.wait(GRACE_SECONDS)
    log.error(
        "worker %d did not stop in %.0f s after its server died; exiting",
        os.getpid(),
        GRACE_SECONDS,
    )
    os._exit(1)


def end_with_parent(parent: int | None = None) -> None:
    """Make this process stop when ``parent`` (default: its parent now) dies. Once."""
    global _armed
    if _armed:
        return
    _armed = True
    parent = os.getppid() if parent is None else parent
    # the parent may have died before the death signal was armed: then it never comes
    signalled = _death_signal() and os.getppid() == parent
    threading.Thread(
        target=_watch, args=(parent, signalled), name="collapse-guard-lifeline", daemon=True
    ).start()
