"""Ramp rescues (issue 32): false rescues on LR ramps, and what a lifting cap gives back.

The newcomer's set-up: a nanoGPT-style GPT (2 layers, d96, 4 heads, byte-level data,
batch 16 x 64), AdamW at 1e-3 (a 40-step warmup, then held), the LR set by the loop every
step, and a linear ramp of the LR multiplier from 1x at step 200 to ``--ramps`` (30x, 100x,
1000x) at step 499, held to the end (``fault="lr_ramp"``: datasets/real/faults.py); 600
steps. Each ramp is trained by every arm below on the same batches (``demo.run_scenario``,
the guard with the bundled risk model):

================  ==================================================================
arm               what
================  ==================================================================
``unguarded``     no guard (the configuration's own clipping at 1.0)
``before``        the rules before issue 32: an LR rise of 2x within 10 steps is a
                  jump (``lr_jump_span=10``), the rescue's cap stays for the run
                  (``lr_lift_steps=0``)
``permanent``     the jump rule of issue 32 (a step change: ``lr_jump_span=1``), the
                  cap for good (``lr_lift_steps=0``)
``lifting``       that jump rule and the cap that lifts (``lr_lift_steps=20``)
``scale``         ``permanent`` (the defaults) halving the LR at warn instead of holding
                  it (``warn_action="scale"``: the default before the 640-run model)
``reactive``      ``permanent`` with the forecast's actions off (``forecast_actions=
                  False``: the reactive rules and rescues alone)
``olmo_skips``    ``permanent`` skipping outliers over OLMo-core's z = 6 (``outlier_z``;
                  10 by default since issue 32)
================  ==================================================================

A *false rescue* is a rescue in a run whose unguarded twin does not collapse (the label's
rule on its losses: no onset). Reported per ramp and arm: rescues, falls of the cap, the
final loss (mean of the last 20 losses), the LR cap at the end, and the label's onset.

Usage (about 10 minutes on 2 shared cores; ``--workers 1`` on a busy machine)::

    OMP_WAIT_POLICY=passive nice -n 5 python benchmarks/ramp_rescues.py
    OMP_WAIT_POLICY=passive python benchmarks/ramp_rescues.py --ramps 1000 --arms lifting
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import warnings
from pathlib import Path

__all__ = ["ARMS", "main", "newcomer_config"]

ARMS: dict[str, dict | None] = {
    "unguarded": None,
    "before": {"lr_jump_span": 10, "lr_lift_steps": 0},
    "permanent": {"lr_lift_steps": 0},
    "lifting": {"lr_lift_steps": 20},
    "scale": {"warn_action": "scale"},
    "reactive": {"forecast_actions": False},
    "olmo_skips": {"outlier_z": 6.0},
    "hold_waits": {"warn_rescue": False},
}


def newcomer_config(scale: float, steps: int = 600, seed: int = 0, fault: str = "lr_ramp"):
    """The newcomer's GPT with its LR ramp to ``scale`` x over steps 200-499 (``fault``
    ``"lr_jump"``: the LR x ``scale`` at step 200, held)."""
    from collapse_guard.datasets.real.config import RealRunConfig

    return RealRunConfig(
        seed=seed, steps=steps, n_layer=2, d_model=96, n_head=4, lr=1e-3, warmup_steps=40,
        min_lr_ratio=1.0, fault=fault, fault_step=200, fault_steps=300, fault_scale=scale,
    )  # fmt: skip


def _train(job: tuple[float, str, int, int, str]) -> dict:
    """One ramp by one arm: what the tables read."""
    import torch

    from collapse_guard.demo import run_scenario
    from collapse_guard.predictor import RiskModel

    torch.set_num_threads(1)
    scale, arm, seed, steps, fault = job
    policy = ARMS[arm]
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_scenario(
            newcomer_config(scale, steps, seed, fault), RiskModel.load(), policy is not None,
            Path(folder), policy,
        )  # fmt: skip
    events = [e for _, e in run.events]
    return {
        "scale": scale,
        "arm": arm,
        "seed": seed,
        "rescues": sum(e.startswith("rescue:") for e in events),
        "falls": sum(e.startswith("lr_fall:") for e in events),
        "holds": sum(e.startswith("lr_hold:") and e != "lr_hold:off" for e in events),
        "first": next((e for e in events if e.startswith("rescue:")), ""),
        "final": run.final_loss,
        "cap": _last_cap(events),
        "onset": run.onset,
        "gave_up": run.gave_up,
    }


def _last_cap(events: list[str]) -> str:
    """The LR cap after the last event that set it ("none": never set; "off": lifted off)."""
    cap = "none"
    for event in events:
        kind, _, value = event.partition(":")
        if kind in ("lr_ceiling", "lr_lift", "lr_fall"):
            cap = value.split("@")[0]
    return cap


def _tables(rows: list[dict]) -> None:
    survives = {
        (r["scale"], r["seed"]) for r in rows if r["arm"] == "unguarded" and r["onset"] is None
    }
    head = "| x | seed | arm | rescues | falls | holds | first rescue | final loss | cap at end |"
    print(head + " onset |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["scale"], r["seed"], list(ARMS).index(r["arm"]))):
        final = f"{r['final']:.3f}" + (" (gave up)" if r["gave_up"] else "")
        rescues = "" if r["arm"] == "unguarded" else r["rescues"]
        cells = (f"{r['scale']:g}x", r["seed"], r["arm"], rescues, r["falls"], r["holds"])
        cells += (r["first"], final)
        print("| " + " | ".join(map(str, (*cells, r["cap"], r["onset"]))) + " |")
    print()
    for arm in ARMS:
        false = [
            r["rescues"] for r in rows if r["arm"] == arm and (r["scale"], r["seed"]) in survives
        ]
        if arm != "unguarded" and false:
            runs = ", ".join(f"{s:g}x seed {seed}" for s, seed in sorted(survives))
            print(f"false rescues, {arm}: {sum(false)} on the runs unguarded survives ({runs})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ramps", type=float, nargs="+", default=[30.0, 100.0, 1000.0])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--jump", action="store_true", help="a step change to x, not a ramp")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # for the spawned workers
    fault = "lr_jump" if args.jump else "lr_ramp"
    grid = [(s, arm, seed) for s in args.ramps for arm in args.arms for seed in args.seeds]
    jobs = [(scale, arm, seed, args.steps, fault) for scale, arm, seed in grid]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        rows = pool.map(_train, jobs, chunksize=1)
    _tables(rows)


if __name__ == "__main__":
    main()
