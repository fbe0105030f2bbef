"""Cost of durable run files: chunked RunWriter vs one write at the end, same process.

    python benchmarks/runfile_write.py [--steps 20000] [--chunk 256]

Prints seconds for both and the durability cost per step. Every signal column is filled,
as the probe fills them, so the files have their real width.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from collapse_guard.runfiles import RunMeta, RunWriter, write_run
from collapse_guard.signals import SIGNAL_NAMES


def _records(steps: int) -> list[dict[str, float]]:
    values = np.random.default_rng(0).random((steps, len(SIGNAL_NAMES)))
    return [dict(zip(SIGNAL_NAMES, row.tolist(), strict=True)) for row in values]


def _chunked(path: Path, records: list[dict[str, float]], chunk: int) -> float:
    t0 = time.perf_counter()
    with RunWriter(path, RunMeta(run_id="bench", source="real"), chunk_steps=chunk) as writer:
        for step, record in enumerate(records):
            writer.append(step, record)
    return time.perf_counter() - t0


def _at_end(path: Path, records: list[dict[str, float]]) -> float:
    t0 = time.perf_counter()
    frame = pd.DataFrame(records)
    frame.insert(0, "step", np.arange(len(records)))
    write_run(path, frame, RunMeta(run_id="bench", source="real"))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=256)
    args = parser.parse_args()
    records = _records(args.steps)
    with tempfile.TemporaryDirectory() as folder:
        chunked = _chunked(Path(folder) / "chunked.parquet", records, args.chunk)
        at_end = _at_end(Path(folder) / "once.parquet", records)
    extra = chunked - at_end
    print(f"{args.steps} steps, {len(SIGNAL_NAMES)} signals, chunk {args.chunk}")
    print(f"chunked durable writer: {chunked:.2f} s; one write at the end: {at_end:.2f} s")
    print(f"durability cost: {extra:.2f} s in all, {1e6 * extra / args.steps:.0f} us a step")


if __name__ == "__main__":
    main()
