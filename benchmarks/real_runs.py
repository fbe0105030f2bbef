"""Real-run generation throughput and outcome mix (issue 3 target: >= 200 runs with
>= 70 collapses of >= 3 kinds in <= 60 minutes on the 2-core machine).

    OMP_WAIT_POLICY=passive .venv/bin/python benchmarks/real_runs.py --n 200 --workers 2

Resumable like the command: rerun with the same ``--out`` to finish a sweep; figures
about time count only the runs made by this call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter
from pathlib import Path

__all__ = ["main"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="runs in the sweep")
    parser.add_argument("--workers", type=int, default=2, help="local worker processes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the config sweep")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: config)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-real"), help="run folder")
    args = parser.parse_args()

    os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before torch is imported anywhere
    from collapse_guard.datasets.real import RealRunConfig, generate_real_runs, run_id_for
    from collapse_guard.datasets.runfile import read_meta

    steps = args.steps or RealRunConfig.steps
    names = [f"{run_id_for(args.seed, i)}.parquet" for i in range(args.n)]
    existing = sum((args.out / name).exists() for name in names)
    began = time.perf_counter()
    paths = generate_real_runs(args.n, args.out, workers=args.workers, seed=args.seed, steps=steps)
    minutes = (time.perf_counter() - began) / 60
    metas = [read_meta(path) for path in paths]
    collapsed = [m for m in metas if m.onset_step is not None]
    made = len(paths) - existing

    print(f"runs: {len(metas)} ({made} made by this call, {existing} already there)")
    if made:
        print(f"time: {minutes:.1f} min, {made / minutes:.2f} runs/min with {args.workers} workers")
        print(f"projected for 200 runs: {200 / (made / minutes):.0f} min")
    seconds = [m.extra["seconds"] for m in metas]
    print(
        f"seconds per run (one worker): mean {statistics.mean(seconds):.1f}, max {max(seconds):.1f}"
    )
    print(f"collapsed: {len(collapsed)} ({len(collapsed) / len(metas):.0%})")
    print("  by cause:", dict(Counter(m.extra["collapse_cause"] for m in collapsed)))
    print("  by label kind:", dict(Counter(m.extra["collapse_kind"] for m in collapsed)))
    onsets = sorted(m.onset_step / m.config["steps"] for m in collapsed)
    if onsets:
        quartiles = statistics.quantiles(onsets, n=4) if len(onsets) > 1 else onsets * 3
        print("  onset / steps, quartiles:", ", ".join(f"{q:.2f}" for q in quartiles))
    healthy = [m for m in metas if m.onset_step is None]
    spiky = sum(bool(m.extra.get("spikes")) for m in healthy)
    hard = sum(m.config["lr"] >= 0.03 for m in healthy)
    print(f"healthy: {len(healthy)}, with recovered spikes {spiky}, at LR >= 0.03 {hard}")
    print(
        "by recipe (runs/collapsed):",
        {
            recipe: f"{sum(m.config['recipe'] == recipe for m in metas)}/"
            f"{sum(m.config['recipe'] == recipe for m in collapsed)}"
            for recipe in sorted({m.config["recipe"] for m in metas})
        },
    )


if __name__ == "__main__":
    main()
