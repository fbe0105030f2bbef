"""Rescue benchmark (partial): sampled configurations that collapse unguarded, run guarded.

Issue 10 asks for 30+ seeded configurations that collapse unguarded, half developing over
50+ steps and half sudden, and the share that finish healthy under the guard (target: 80%
of each half). One unguarded and one guarded run cost 1-2 minutes on the shared 2-core
machine, so this script runs a few: it scans the real-run sampler's sweep ``--seed`` from
index 0, keeps the first ``--develops`` configurations of the recipes whose collapses
develop (``slow_ramp``, ``growing_fault``, ``constant_high``) and the first ``--sudden``
of ``sudden``, trains each unguarded (the loop of ``collapse_guard.demo.run_scenario``:
the runner's loop with its fault hooks), and, where the label finds a collapse, trains it
again under the guard with the bundled model. Reported per configuration: the unguarded
onset, the guarded outcome (the label on the guarded run's losses), final losses, rescues,
steps lost to rollbacks and wall time; then the share rescued per half.

Usage::

    OMP_WAIT_POLICY=passive python benchmarks/guard_rescue.py --develops 3 --sudden 3 --steps 500
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
import warnings
from pathlib import Path

import torch

from collapse_guard.datasets.real.sampler import sample_config
from collapse_guard.demo import run_scenario
from collapse_guard.predictor import RiskModel

__all__ = ["main"]

DEVELOPS = ("slow_ramp", "growing_fault", "constant_high")
SUDDEN = ("sudden",)
_ROLLBACK = re.compile(r"rollback:avg\d+@(\d+)")


def _steps_lost(events: list[tuple[int, str]]) -> int:
    """Steps undone by rollbacks: each rescue step minus the step its checkpoint holds."""
    return sum(step - int(m.group(1)) for step, e in events if (m := _ROLLBACK.match(e)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--develops", type=int, default=3)
    parser.add_argument("--sudden", type=int, default=3)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scan", type=int, default=200, help="sweep indices to look through")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # preflight: small models train above the seed's LRs
    model = RiskModel.load()
    wanted = {"develops": args.develops, "sudden": args.sudden}
    rows, began = [], time.perf_counter()
    columns = (
        "index",
        "recipe",
        "half",
        "family/optimizer",
        "unguarded onset",
        "guarded",
        "final loss unguarded -> guarded",
        "rescues",
        "steps lost",
        "wall s",
    )
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for index in range(args.scan):
        if not any(wanted.values()):
            break
        config = sample_config(args.seed, index, args.steps)
        half = (
            "develops" if config.recipe in DEVELOPS else "sudden" if config.recipe in SUDDEN else ""
        )
        if not half or not wanted[half]:
            continue
        t0 = time.perf_counter()
        plain = run_scenario(config, model, guarded=False)
        if plain.onset is None:
            continue  # healthy unguarded: not a rescue case
        wanted[half] -= 1
        out = Path(tempfile.mkdtemp(prefix="guard-rescue-"))
        try:
            guarded = run_scenario(config, model, guarded=True, out=out)
            outcome = "healthy" if guarded.onset is None else f"collapsed {guarded.onset}"
            rescues = sum(e.startswith("rescue") for _, e in guarded.events)
            lost, final = _steps_lost(guarded.events), f"{guarded.final_loss:.3f}"
        except Exception as error:  # GuardGaveUp: the run is not rescued
            outcome, rescues, lost, final = f"gave up ({type(error).__name__})", "-", "-", "-"
        rows.append((half, outcome == "healthy"))
        print(
            f"| {index} | {config.recipe} | {half} | {config.family}/{config.optimizer} | "
            f"{plain.onset} ({plain.kind}) | {outcome} | {plain.final_loss:.3f} -> {final} | "
            f"{rescues} | {lost} | {time.perf_counter() - t0:.0f} |",
            flush=True,
        )
    for half in ("develops", "sudden"):
        got = [ok for h, ok in rows if h == half]
        print(f"{half}: {sum(got)}/{len(got)} finished healthy under the guard")
    print(f"total wall {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
