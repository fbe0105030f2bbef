"""A change of the data made on purpose, in the loop written apart: the guard told of it
(``guard.data_changed()``) or not.

A loop that moves to another data mixture (a curriculum's next stage, an annealing mix,
fine-tuning data) sees its loss jump and stay up while the model learns the new data. The
guard read that as a collapse that developed: it rolled back to the old data's weights, at
which every new batch is an outlier, and could stop the run as one whose data went bad.
Here set-ups of ``outside_loop.py`` that do not collapse train on their language until
``--switch``, then on another (seed + 500), by three arms on the same batches:
``unguarded``, ``silent`` (guarded, the loop says nothing) and ``announced`` (guarded,
``guard.data_changed()`` at the switch). Reported: each arm's final loss (the mean of the
last 50), the guard's rescues and skipped batches, and whether it gave up.

Usage (about 4 minutes on 2 cores)::

    OMP_WAIT_POLICY=passive python benchmarks/data_switch.py
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import warnings
from dataclasses import replace

import outside_loop as loop

__all__ = ["ARMS", "SETUPS", "main"]

ARMS = ("unguarded", "silent", "announced")
SETUPS = ("adamw_ok", "adamw_ok_long", "sgd_ok", "muon_ok", "adamw_fp16_ok", "nadam_ok")


def _job(job: tuple[str, str, int, int]) -> dict:
    name, arm, switch, steps = job
    setup = replace(loop.SETUPS[name], steps=steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = loop.train(setup, "unguarded" if arm == "unguarded" else "guarded", switch,
                         announce=arm == "announced")  # fmt: skip
    return {**row, "arm": arm}


def _final(row: dict) -> float:
    """The mean of the last 50 losses; inf for a run the guard stopped."""
    return math.inf if "gave_up" in row["summary"] else loop._final(row["losses"])


def _cell(row: dict) -> str:
    summary = row["summary"]
    final = "gave up" if "gave_up" in summary else f"{_final(row):.3f}"
    return f"{final} ({summary.get('rescues', 0)}, {summary.get('skipped', 0)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--switch", type=int, default=300, help="the step the data changes")
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # for the spawned workers
    jobs = [(name, arm, args.switch, args.steps) for name in SETUPS for arm in ARMS]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        rows = {(r["setup"], r["arm"]): r for r in pool.imap_unordered(_job, jobs)}
    print(f"the data changes at step {args.switch} of {args.steps}; final (rescues, skips)\n")
    print("| set-up | unguarded | silent | announced |")
    print("|---|---|---|---|")
    for name in SETUPS:
        cells = " | ".join(_cell(rows[name, arm]) for arm in ARMS[1:])
        print(f"| {name} | {_final(rows[name, 'unguarded']):.3f} | {cells} |")
    for arm in ARMS[1:]:
        gaps = sorted(_final(rows[n, arm]) - _final(rows[n, "unguarded"]) for n in SETUPS)
        stopped = sum("gave_up" in rows[n, arm]["summary"] for n in SETUPS)
        print(f"{arm}: guarded - unguarded median {gaps[len(gaps) // 2]:+.3f}, worst "
              f"{gaps[-1]:+.3f}; gave up {stopped} of {len(SETUPS)}")  # fmt: skip


if __name__ == "__main__":
    main()
