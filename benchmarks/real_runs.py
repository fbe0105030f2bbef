"""Real-run generation throughput and outcome mix, per family, optimizer, data and onset kind.

Issue 8 targets: >= 3 families x 2 optimizers x 2 data kinds; of >= 400 runs, >= 150
collapses that develop (onset >= 50 steps after every trigger before it) and >= 80
sudden ones (< 10 steps after their trigger); runs per minute recorded.

    OMP_WAIT_POLICY=passive .venv/bin/python benchmarks/real_runs.py --n 400 --workers 2 \\
        --out /root/cg-data/real

Resumable like the command: rerun with the same ``--out`` to finish a sweep; figures
about time count only the runs made by this call. ``--report-only`` makes nothing and
reads the finished run files of ``--out`` (safe beside a sweep that is still writing
there), of every sweep there (a focused top-up, ``--recipes``, included); its runs/min
comes from the files' own times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path

__all__ = ["OUTCOMES", "main", "mix_table", "outcome"]

DEVELOPS_LEAD = 50  # steps: issue 8 counts a collapse as developing at 50+ steps after


def outcome(meta) -> str:
    """``healthy``, ``sudden``, ``develops`` (>= 50 steps after) or ``develops<50``."""
    kind = meta.extra.get("onset_kind")
    if kind is None:
        return "healthy"
    if kind == "develops" and meta.extra.get("trigger_to_onset", 0) < DEVELOPS_LEAD:
        return "develops<50"
    return kind


OUTCOMES = ("healthy", "develops", "develops<50", "sudden")


def mix_table(metas, key: str) -> list[str]:
    """Rows ``value: runs, healthy, develops, develops<50, sudden`` grouped by config ``key``."""
    groups: dict[str, Counter] = defaultdict(Counter)
    for meta in metas:
        groups[str(meta.config.get(key))][outcome(meta)] += 1
    width = max(len(k) for k in groups) if groups else 4
    rows = [f"  {key:<{width}}  runs  " + "  ".join(f"{o:>11}" for o in OUTCOMES)]
    for value, counts in sorted(groups.items()):
        rows.append(
            f"  {value:<{width}}  {sum(counts.values()):>4}  "
            + "  ".join(f"{counts[o]:>11}" for o in OUTCOMES)
        )
    return rows


def _report_span(paths: list[Path], metas: list, workers: int) -> None:
    """Runs/min of finished files: their count over the span of their modification times."""
    stamps = sorted(path.stat().st_mtime for path in paths)
    first_began = stamps[0] - metas[0].extra["seconds"]  # approximately: the first to finish
    minutes = (stamps[-1] - first_began) / 60
    print(f"runs: {len(metas)} finished in {minutes:.1f} min (first start to last finish)")
    if len(metas) > 1 and minutes > 0:
        print(f"throughput: {len(metas) / minutes:.2f} runs/min ({workers} workers assumed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="runs in the sweep")
    parser.add_argument("--workers", type=int, default=2, help="local worker processes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the config sweep")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: config)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-real"), help="run folder")
    parser.add_argument(
        "--report-only", action="store_true", help="read the finished runs of --out, make none"
    )
    args = parser.parse_args()

    os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before torch is imported anywhere
    from collapse_guard.datasets.real import RealRunConfig, generate_real_runs, run_id_for
    from collapse_guard.runfiles import read_meta

    if args.report_only:
        paths = sorted(args.out.glob("real-s*.parquet"))
        metas = [read_meta(path) for path in paths]
        if not metas:
            raise SystemExit(f"error: {args.out}: no finished real run files")
        _report_span(paths, metas, args.workers)
    else:
        steps = args.steps or RealRunConfig.steps
        names = [f"{run_id_for(args.seed, i)}.parquet" for i in range(args.n)]
        existing = sum((args.out / name).exists() for name in names)
        began = time.perf_counter()
        paths = generate_real_runs(
            args.n, args.out, workers=args.workers, seed=args.seed, steps=steps
        )
        minutes = (time.perf_counter() - began) / 60
        metas = [read_meta(path) for path in paths]
        made = len(paths) - existing
        print(f"runs: {len(metas)} ({made} made by this call, {existing} already there)")
        if made:
            print(
                f"time: {minutes:.1f} min, {made / minutes:.2f} runs/min "
                f"with {args.workers} workers"
            )
    seconds = [m.extra["seconds"] for m in metas]
    per_step = [m.extra["seconds"] / m.extra["steps_run"] * 1000 for m in metas]
    print(
        f"seconds per run (one worker): mean {statistics.mean(seconds):.1f}, "
        f"max {max(seconds):.1f}; ms per step: median {statistics.median(per_step):.0f}"
    )
    outcomes = Counter(outcome(m) for m in metas)
    print(
        "outcomes:",
        ", ".join(f"{o} {outcomes[o]} ({outcomes[o] / len(metas):.0%})" for o in OUTCOMES),
    )
    keys = ["recipe", "family", "optimizer", "data"]
    if any(m.config.get("family") == "drawn" for m in metas):  # its parts are drawn too
        keys += ["block", "norm", "pre_ln", "positions", "mlp", "tied", "n_head"]
    for key in keys:
        print("\n".join(mix_table(metas, key)))
    collapsed = [m for m in metas if m.onset_step is not None]
    print("collapse causes:", dict(Counter(m.extra["collapse_cause"] for m in collapsed)))
    gaps = sorted(m.extra["trigger_to_onset"] for m in collapsed)
    if len(gaps) > 1:
        quartiles = statistics.quantiles(gaps, n=4)
        print("trigger to onset, steps, quartiles:", ", ".join(f"{q:.0f}" for q in quartiles))
    healthy = [m for m in metas if m.onset_step is None]
    spiky = sum(bool(m.extra.get("spikes")) for m in healthy)
    print(f"healthy: {len(healthy)}, with recovered spikes {spiky}")


if __name__ == "__main__":
    main()
