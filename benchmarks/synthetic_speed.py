"""Synthetic runs per second: generate, label and write N runs with W workers.

    OMP_WAIT_POLICY=passive python benchmarks/synthetic_speed.py --n 10000 --workers 2

Writes into a fresh temporary folder (removed afterwards unless --keep), so every
run is generated (nothing skipped). Prints the figure, the label agreement and (with
--realism) how the first 500 runs compare with the real runs' reference
(``collapse_guard/datasets/synthetic/real_reference.json``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from collapse_guard.datasets.synthetic import generate_synthetic_runs, label_agreement
from collapse_guard.datasets.synthetic.realism import compare_to_reference
from collapse_guard.runfiles import read_meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="runs to generate")
    parser.add_argument("--workers", type=int, default=2, help="spawn pool size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="write here and keep the runs")
    parser.add_argument(
        "--realism", action="store_true", help="compare with the real runs' reference"
    )
    args = parser.parse_args()

    out = args.keep or Path(tempfile.mkdtemp(prefix="synth-bench-"))
    if any(out.glob("*.parquet")):
        raise SystemExit(f"{out} already holds runs; the benchmark needs an empty folder")
    try:
        start = time.perf_counter()
        paths = generate_synthetic_runs(args.n, out, args.seed, workers=args.workers, progress=True)
        elapsed = time.perf_counter() - start
        size = sum(p.stat().st_size for p in paths)
        metas = [read_meta(p) for p in paths]
        rows = sum(m.extra["synthetic_spec"]["n_steps"] for m in metas)
        print(
            f"{args.n} runs ({rows:,} steps before gaps, {size / 1e6:.0f} MB) with "
            f"{args.workers} worker(s) on {os.cpu_count()} CPUs: {elapsed:.1f} s, "
            f"{args.n / elapsed:.1f} runs/s"
        )
        print(label_agreement(metas).summary())
        if args.realism:
            report = compare_to_reference(paths[:500])
            print(report.table())
            print(report.summary().splitlines()[0])
    finally:
        if args.keep is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
