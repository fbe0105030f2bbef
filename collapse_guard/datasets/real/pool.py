"""Many real runs in parallel: a spawn process pool, or a Dask distributed cluster.

Each run is one task, ``run_task(config, path, run_id)``, the same function on both
paths. Workers are single-threaded (``torch.set_num_threads(1)``): at this model
size one thread per run, one run per core, is the fastest use of a machine.

Resumable: run ``i`` of a seed always gets the same id, file name and config, a
finished file is skipped, and a leftover ``.tmp`` (a run killed midway) is redone.

Stoppable: Ctrl-C or SIGTERM stops the sweep at once (``datasets.parallel``: the
workers are terminated mid-run, SIGTERM raises ``Stopped``, a ``KeyboardInterrupt``);
the finished run files stay, the unfinished runs' ``.tmp`` files are removed, and the
same call resumes. Runs on a Dask cluster are cancelled, but a task already running on
a worker finishes there (Dask cannot stop it).

Processes are started by spawn, never fork (``datasets.parallel``, shared with the
synthetic generator). ``OMP_WAIT_POLICY=passive`` is set in the parent before the pool
starts (children inherit it) and again in each child before torch is imported:
spinning OpenMP threads make a busy machine crawl.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Generator, Iterator
from pathlib import Path

from collapse_guard.datasets.parallel import run_progress, spawn_pool, stop_on_sigterm
from collapse_guard.datasets.real.config import RealRunConfig
from collapse_guard.datasets.real.runner import RunResult, temp_path
from collapse_guard.datasets.real.sampler import Focus
from collapse_guard.datasets.real.sweeps import sample_configs

__all__ = ["generate_real_runs", "run_id_for", "run_task"]


def run_id_for(seed: int, index: int, focus: Focus | None = None) -> str:
    """Stable id of run ``index`` of the sweep drawn with ``seed`` (also its file name);
    a focused sweep's ids carry its tag: ``real-s1-slow_ramp.lion-00003``."""
    tag = f"{focus.tag}-" if focus and focus != Focus() else ""
    return f"real-s{seed}-{tag}{index:05d}"


def _single_threaded_env() -> None:
    # must happen before torch is imported in this process to have any effect
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def run_task(config: dict, path: str, run_id: str) -> RunResult:
    """Child entry point: one run, single-threaded. Plain arguments so it pickles anywhere."""
    _single_threaded_env()
    import torch

    from collapse_guard.datasets.real.runner import run_real

    torch.set_num_threads(1)
    return run_real(RealRunConfig.from_dict(config), Path(path), run_id)


def _results_in_process(tasks: list[tuple[dict, str, str]]) -> Generator[RunResult, None, None]:
    from collapse_guard.datasets.real.runner import run_real

    for config, path, run_id in tasks:
        yield run_real(RealRunConfig.from_dict(config), Path(path), run_id)


def _results_from_pool(
    tasks: list[tuple[dict, str, str]], workers: int
) -> Generator[RunResult, None, None]:
    _single_threaded_env()  # children inherit the parent's environment at spawn
    yield from spawn_pool(run_task, tasks, workers, initializer=_single_threaded_env)


def _results_from_dask(
    tasks: list[tuple[dict, str, str]], scheduler: str
) -> Generator[RunResult, None, None]:
    from distributed import as_completed as dask_completed

    from collapse_guard._scheduler import scheduler_client

    with scheduler_client(scheduler, "--scheduler") as client:
        # pure=False: a run is a side effect (a file), never deduplicated by Dask
        futures = [
            client.submit(run_task, *task, key=f"collapse-guard-{task[2]}", pure=False)
            for task in tasks
        ]
        for future in dask_completed(futures):
            yield future.result()


def generate_real_runs(
    n: int,
    out: Path,
    *,
    workers: int = 2,
    seed: int = 0,
    scheduler: str | None = None,
    steps: int = RealRunConfig.steps,
    focus: Focus | None = None,
    progress: bool = True,
) -> list[Path]:
    """Make (or finish making) ``n`` labelled real runs in ``out``; return their paths.

    ``scheduler`` is a Dask scheduler address (``tcp://host:8786``); without it the
    runs go to a local spawn pool of ``workers`` processes. One worker (or one run
    left to do) runs in this process, with its torch thread settings: no start-up cost.
    ``focus`` narrows the sweep to some recipes and optimizers (``sampler.Focus``).
    Ctrl-C or SIGTERM stops it at once (module docstring) and raises
    ``KeyboardInterrupt`` (``parallel.Stopped`` for SIGTERM) once the workers are gone.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}; pass the number of runs to make")
    if scheduler is None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}; use 1 for a single process")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = [run_id_for(seed, i, focus) for i in range(n)]
    paths = [out / f"{run_id}.parquet" for run_id in ids]
    configs = sample_configs(n, seed=seed, steps=steps, focus=focus)
    tasks = [
        (config.to_dict(), str(path), run_id)
        for config, path, run_id in zip(configs, paths, ids, strict=True)
        if not path.exists()
    ]
    if scheduler is not None:
        results = _results_from_dask(tasks, scheduler)
    elif workers == 1 or len(tasks) <= 1:
        results = _results_in_process(tasks)
    else:
        results = _results_from_pool(tasks, min(workers, len(tasks)))
    with stop_on_sigterm():
        try:
            _drain(results, total=n, done=n - len(tasks), show=progress and bool(tasks))
        except BaseException:  # Ctrl-C, SIGTERM, a run's error
            results.close()  # the workers are gone before their files are touched
            for path in paths:
                temp_path(path).unlink(missing_ok=True)
            raise
    return paths


def _drain(results: Iterator[RunResult], *, total: int, done: int, show: bool) -> None:
    """Consume ``results`` while a rich progress bar counts healthy, developing and sudden runs."""
    kinds: Counter[str] = Counter()
    with run_progress("[bold]real runs", total=total, done=done, enabled=show) as advance:
        for result in results:
            kinds[result.onset_kind or "healthy"] += 1
            advance(", ".join(f"{kind} {count}" for kind, count in kinds.most_common()))
