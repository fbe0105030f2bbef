"""What every generator of many runs shares: a spawn process pool and a progress bar.

``spawn_pool(fn, tasks, workers)`` yields ``fn(*task)`` for each task as the workers
finish them. Processes are started by spawn, never fork: a forked child of a process
that already ran torch, numpy or OpenMP work can hang (../shared/STACK.md), and spawn
behaves the same on every platform. A ``ProcessPoolExecutor`` rather than
``multiprocessing.Pool``: a worker that dies (out of memory, a crash in native code)
raises ``BrokenProcessPool`` here instead of hanging the pool.

``run_progress(label, total=, done=)`` is the rich bar both generators show: runs done
out of ``total`` (``done`` of them were already on disk), time spent and left, and a
description the caller may update with each run (e.g. the collapse causes so far).

rich and the pool are imported and started only when used: importing this module is free.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["run_progress", "spawn_pool"]

R = TypeVar("R")


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
    once in each worker before its first task. A task's exception is raised here.
    """
    context = multiprocessing.get_context("spawn")
    chunks = [tasks[i : i + chunksize] for i in range(0, len(tasks), chunksize)]
    with ProcessPoolExecutor(workers, mp_context=context, initializer=initializer) as pool:
        futures = [pool.submit(_run_chunk, fn, chunk) for chunk in chunks]
        for future in as_completed(futures):
            yield from future.result()


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
