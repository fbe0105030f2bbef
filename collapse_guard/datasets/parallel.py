"""What every generator of many runs shares: a spawn process pool and a progress bar.

``spawn_pool(fn, tasks, workers)`` yields ``fn(*task)`` for each task as the workers
finish them. Processes are started by spawn, never fork: a forked child of a process
that already ran torch, numpy or OpenMP work can hang (docs/stack.md, "OpenMP"), and spawn
behaves the same on every platform. A ``ProcessPoolExecutor`` rather than
``multiprocessing.Pool``: a worker that dies (out of memory, a crash in native code)
raises ``BrokenProcessPool`` here instead of hanging the pool.

``run_progress(label, total=, done=)`` is the rich bar both generators show: runs done
out of ``total`` (``done`` of them were already on disk), time spent and left, and a
description the caller may update with each run (e.g. the collapse causes so far).

Stopping. ``spawn_pool`` keeps two chunks per worker in flight, not every task at once,
and on any exception in the parent (Ctrl-C's ``KeyboardInterrupt``, ``stop_on_sigterm``'s
``Stopped``, the consumer closing it) terminates its workers and waits for them before
the exception goes on: no worker outlives the pool, and the caller may remove the files
they left half-written. Workers ignore SIGINT (a terminal's Ctrl-C reaches the whole
process group; the parent alone decides) and die with the parent on Linux
(``PR_SET_PDEATHSIG``), so even a parent killed outright leaves no orphans.

rich and the pool are imported and started only when used: importing this module is free.
"""

from __future__ import annotations

import ctypes
import itertools
import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["Stopped", "run_progress", "spawn_pool", "stop_on_sigterm"]

R = TypeVar("R")

_IN_FLIGHT_PER_WORKER = 2  # chunks queued per worker: it never waits for its next one


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C's ``KeyboardInterrupt`` would be, so
    that both stop a job the same way (``stop_on_sigterm``)."""

    signal_name = "SIGTERM"


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Stopped` in the main thread (Python's
    default dies on the spot: no ``finally``, workers and temp files left behind). The
    previous handler comes back afterwards; off the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise Stopped()

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _worker_start(initializer: Callable[[], None] | None) -> None:
    # the parent stops the pool: a terminal's Ctrl-C, sent to every process of the group,
    # would otherwise print a traceback per worker and leave the parent's bar frozen
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):  # die with the parent, even one killed by SIGKILL
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    if initializer is not None:
        initializer()


def _terminate(pool: ProcessPoolExecutor) -> None:
    """Stop the pool's workers now (mid-task), then wait for them and the pool."""
    # concurrent.futures has no public way to stop a running task before Python 3.14
    stop = getattr(pool, "terminate_workers", None)
    if stop is not None:
        stop()
    else:
        for process in list((pool._processes or {}).values()):
            process.terminate()
        for process in list((pool._processes or {}).values()):
            process.join()
    pool.shutdown(wait=True, cancel_futures=True)


def _run_chunk(fn: Callable[..., R], chunk: Sequence[tuple]) -> list[R]:
    # one task of the pool for several runs: a run of tens of ms would otherwise cost
    # about as much in inter-process traffic as in work
    return [fn(*task) for task in chunk]


def spawn_pool(
    fn: Callable[..., R],
    tasks: Sequence[tuple],
    workers: int,
    *,
    chunksize: int = 1,
    initializer: Callable[[], None] | None = None,
) -> Iterator[R]:
    """``fn(*task)`` for every task, on ``workers`` spawned processes, in completion order.

    ``fn`` must be a module-level function and each task a tuple of plain (picklable)
    arguments. ``chunksize`` tasks travel to a worker together; ``initializer`` runs
    once in each worker before its first task. A task's exception is raised here. On any
    exception, or when the generator is closed, the workers are terminated and waited
    for (module docstring: Stopping).
    """
    context = multiprocessing.get_context("spawn")
    chunks = iter([tasks[i : i + chunksize] for i in range(0, len(tasks), chunksize)])
    pool = ProcessPoolExecutor(
        workers, mp_context=context, initializer=_worker_start, initargs=(initializer,)
    )
    pending: set = set()

    def submit(n: int) -> None:
        for chunk in itertools.islice(chunks, n):
            pending.add(pool.submit(_run_chunk, fn, chunk))

    try:
        submit(_IN_FLIGHT_PER_WORKER * workers)
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                pending.discard(future)
                submit(1)
                yield from future.result()
    except BaseException:  # Ctrl-C, SIGTERM, a task's error, the consumer closing us
        _terminate(pool)
        raise
    pool.shutdown(wait=True)


@contextmanager
def run_progress(
    label: str, *, total: int, done: int = 0, enabled: bool = True
) -> Iterator[Callable[..., None]]:
    """A rich progress bar over runs; yields ``advance(description=None)``, called per run.

    ``label`` may carry rich markup (``"[bold]real runs"``). With ``enabled=False``
    (tests, library calls) nothing is drawn and ``advance`` only counts.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, disable=not enabled) as bar:
        task = bar.add_task("", total=total, completed=done)

        def advance(description: str | None = None) -> None:
            bar.update(task, advance=1, description=description)

        yield advance
