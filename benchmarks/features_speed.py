"""Speed of feature extraction: one streaming window, and a whole run in batch.

Targets (issue 4): one streaming window in at most 200 µs; batch extraction at least
20,000 windows per second on one core. Run on one core:

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive .venv/bin/python benchmarks/features_speed.py

The run is what the probe records with default periods: per-step signals, attention
and output probes every 50 steps, system telemetry every 100, AMP and curvature
signals absent (NaN), 26 signals in all, window 200.

A streaming window is one call into the compiled kernel (numba) plus about 15 numpy
calls that build its step grid (and, from a DataFrame, one pandas call per signal
column), so part of its time scales with the per-call overhead of the machine; the last
line prints that overhead (one small ufunc call) so figures from different machines can
be compared. Since features version 3 a window also carries the run context: "frame"
and "array" compute it from the 200 rows given (``context=None``), "context given" takes
it as a mapping (what the service gets), and "RunContext.update" is what the live
accumulator costs per training step (the guard's side). Batch figures are given in wall
time and in CPU time of this process: on a machine loaded by other jobs the wall figure
mostly measures the share of the core this process got. "first call" is the first
window's time: the kernel's compile on a fresh checkout, else loading it from numba's
cache.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pandas as pd

from collapse_guard.features import FeatureExtractor, RunContext
from collapse_guard.signals import SIGNALS

__all__ = ["probe_run"]


def probe_run(steps: int, seed: int = 0) -> pd.DataFrame:
    """A synthetic run with every signal at its default period."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    frame = pd.DataFrame({"step": t})
    for s in SIGNALS:
        if s.period == 0 or s.group == "amp":
            frame[s.name] = np.nan  # off by default / no AMP
        else:
            frame[s.name] = np.where(t % s.period == 0, rng.lognormal(0, 0.5, steps), np.nan)
    frame["loss_nonfinite"] = 0.0
    return frame


def best_of(fn, repeat: int, clock=time.perf_counter) -> float:
    """Fastest of ``repeat`` calls by ``clock``, in seconds (the least disturbed by
    other load)."""
    fn()
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


def once(fn) -> float:
    """Seconds one call takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="length of the batch run")
    parser.add_argument("--repeat", type=int, default=200, help="streaming repetitions")
    args = parser.parse_args()

    fx = FeatureExtractor()
    run = probe_run(args.steps)
    tail = run.iloc[-fx.window :].reset_index(drop=True)
    values = tail[list(fx.signals)].to_numpy()
    steps = tail["step"].to_numpy()

    first_s = once(lambda: fx.transform_array(values, steps))
    frame_s = best_of(lambda: fx.transform_window(tail), args.repeat)
    array_s = best_of(lambda: fx.transform_array(values, steps), args.repeat)
    ctx = RunContext.from_schema(fx.schema)
    records = tail[list(fx.signals)].to_dict("records")
    for step, record in zip(steps, records, strict=True):
        ctx.update(int(step), record)
    context = ctx.get()
    given_s = best_of(lambda: fx.transform_window(tail, context=context), args.repeat)
    feed = iter(range(int(steps[-1]) + 1, 10**9))
    update_s = best_of(lambda: ctx.update(next(feed), records[-1]), args.repeat)
    batch_s = best_of(lambda: fx.transform_run(run), 3)
    batch_cpu_s = best_of(lambda: fx.transform_run(run), 3, clock=time.process_time)
    small = np.ones(26)
    call_s = best_of(lambda: np.add(small, 1.0), 10 * args.repeat)

    print(f"load average        {os.getloadavg()[0]:.2f} (cpus: {os.cpu_count()})")
    print(
        f"features            {len(fx.schema.names)} from {len(fx.signals)} signals, W={fx.window}"
    )
    print(f"first call          {first_s * 1e3:8.1f} ms (kernel compile, or load from cache)")
    print(f"streaming (frame)   {frame_s * 1e6:8.1f} us/window   target <= 200")
    print(f"streaming (array)   {array_s * 1e6:8.1f} us/window   target <= 200")
    print(f"context given       {given_s * 1e6:8.1f} us/window   (frame + a context mapping)")
    print(f"RunContext.update   {update_s * 1e6:8.1f} us/step     (live accumulator, 26 signals)")
    print(f"batch (stride 1)    {args.steps / batch_s:8.0f} windows/s  target >= 20000")
    print(f"batch, CPU time     {args.steps / batch_cpu_s:8.0f} windows per CPU second")
    print(f"numpy call overhead {call_s * 1e6:8.2f} us (np.add on 26 floats; ~0.5 on an idle core)")


if __name__ == "__main__":
    main()
