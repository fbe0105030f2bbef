"""Attention period against lead time: how early the attention group departs before onset.

The other half of the attention-period trade-off (the cost half is
``benchmarks/probe_overhead.py --attention-every 10,25,50``). Real runs are recorded with
attention every 10 steps (the probe's default since issue 8); keeping only every P-th
measurement gives the same runs as if probed every P steps, for P a multiple of 10 (a
probe every 25 steps cannot be emulated: its steps are mostly not multiples of 10). For
each P the model-free group lead (``group_leads.group_leads``: the first step in the
200 before onset at which an attention signal leaves the run's own healthy range) is
computed for every collapse, with the healthy runs as controls. Reported per P: the
share of collapses whose attention group departed at least 10 steps before onset, their
median lead, and the share of healthy controls that departed (the false-departure rate
to read it against).

Usage::

    OMP_WAIT_POLICY=passive python benchmarks/attention_period.py --runs DIR [--periods 10,20,30,50]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pandas as pd
from group_leads import HEALTHY_CONTROL, group_leads

from collapse_guard.predictor.evaluate.events import MIN_LEAD
from collapse_guard.runfiles import list_runs
from collapse_guard.runfiles.records import load_runs
from collapse_guard.signals import SIGNALS

__all__ = ["main", "subsample_attention"]

RECORDED_EVERY = 10  # the probe's attention period when the runs were recorded
ATTENTION = tuple(s.name for s in SIGNALS if s.group == "attention")


def subsample_attention(frame: pd.DataFrame, period: int) -> pd.DataFrame:
    """The run as a probe with attention every ``period`` steps would have recorded it."""
    out = frame.copy()
    off = (out["step"].to_numpy() % period) != 0
    out.loc[off, [c for c in ATTENTION if c in out]] = np.nan
    return out


def _row(period: int, leads: pd.DataFrame) -> dict[str, float]:
    attention = leads[leads["signal_group"] == "attention"]
    collapses = attention[attention["kind"] != HEALTHY_CONTROL]
    controls = attention[attention["kind"] == HEALTHY_CONTROL]
    early = collapses["lead"] >= MIN_LEAD
    return {
        "period": period,
        "collapses": len(collapses),
        "departed >= 10 before": float(early.mean()),
        "median lead": float(collapses.loc[early, "lead"].median()),
        "controls departed": float(controls["lead"].notna().mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="folder of real runs probed every 10")
    parser.add_argument("--periods", default="10,20,30,50", help="attention periods to compare")
    args = parser.parse_args()
    periods = [int(p) for p in args.periods.split(",")]
    if any(p % RECORDED_EVERY for p in periods):
        parser.error(
            f"--periods must be multiples of {RECORDED_EVERY} (the runs' attention period); "
            f"got {args.periods}"
        )
    runs = load_runs(list_runs(args.runs))
    rows = []
    for period in periods:
        probed = [replace(run, frame=subsample_attention(run.frame, period)) for run in runs]
        rows.append(_row(period, group_leads(probed)))
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.2f}"))


if __name__ == "__main__":
    main()
