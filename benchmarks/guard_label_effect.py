"""Does a guard action change the outcome a run would have had? The same seeds, with and without.

Issue 33: guarded runs are training data only where the guard left their outcome known
(``runfiles/censoring.py``). Method: per configuration, one unguarded run (the label of its
losses is the truth) and one guarded run per action, every other action turned off, on the
same seed and batches (``collapse_guard.demo.run_scenario``, the demo's nanoGPT loop):

=============  ===============================================================================
arm            the guard with
=============  ===============================================================================
``skip``       z-score skips only (risk off, QK-clip off)
``qk_clip``    QK-clip only (risk off, no outlier rule)
``layer_clip`` the levels' per-layer clip and tighter global clip, no LR change (bundled model)
``lr``         the levels' LR multiplier and tighter global clip, no per-layer clip
``guard``      everything, as shipped
=============  ===============================================================================

Every arm keeps the rescue (a collapse caught is the outcome itself). Per arm: the
configurations where its action fired before the unguarded onset (or at all, for a healthy
run), how many of those changed the label (collapsed or not, a rescue counted as collapsed)
and by how much the onset moved (both collapsed); then, over the rescued runs, the onset the
censoring gives a rescue (``rescue_label``) against the unguarded onset; and the rows ingest
keeps of each guarded run (``censor_guarded``; prediction rows, before onset) and how many of
those before its first intervention (the rows whose target is the unguarded run's: after it
they are the guarded trajectory's) get a target (collapse within 200 steps) other than the
unguarded run's at that step.

Configurations: the demo's Lion re-warm (``demo.scenario``) at ``--seeds`` seeds, each held
steady (no re-warm: healthy) and re-warmed to ``--ramps`` peak LRs, a GPT of width
``--width`` (2 layers), batch 8, ``--steps`` steps.

Usage::

    OMP_WAIT_POLICY=passive nice -n 5 python benchmarks/guard_label_effect.py --seeds 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch

from collapse_guard.demo import run_scenario, scenario
from collapse_guard.predictor import RiskModel
from collapse_guard.runfiles.censoring import censor_guarded, first_rescue, rescue_label
from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.label import HORIZON, collapse_targets, label_run

NO_OUTLIERS = {"outlier_z": 1e9, "critical_outlier_z": 1e9}
# arm -> (risk: "off" or the bundled model, GuardPolicy fields, the event kind it acts by)
ARMS = {
    "skip": ("off", {"qk_clip": "off"}, "skip"),
    "qk_clip": ("off", NO_OUTLIERS, "qk_clip"),
    "layer_clip": (
        "model",
        {"qk_clip": "off", "warn_lr": 1.0, "critical_lr": 1.0, **NO_OUTLIERS},
        "clip_layers",
    ),
    "lr": ("model", {"qk_clip": "off", "layer_outlier_ratio": 1e9, **NO_OUTLIERS}, "lr_x"),
    "guard": ("model", {}, None),
}


def _configs(args: argparse.Namespace):
    for seed in range(args.seeds):
        for peak in (0.0, *args.ramps):
            yield (
                f"s{seed}-{'steady' if peak == 0 else f'ramp{peak:g}'}",
                scenario(
                    steps=args.steps,
                    lr=4e-3,
                    rewarm_at=args.steps // 3 if peak else 0,
                    rewarm_steps=args.steps // 2,
                    rewarm_lr=peak or 4e-3,
                    optimizer="lion",
                    batch_size=8,
                    seed=seed,
                    d_model=args.width,
                    seq_len=32,
                ),
            )


def _frame(run) -> pd.DataFrame:
    events: dict[int, list[str]] = defaultdict(list)
    for step, event in run.events:
        events[step].append(event)
    steps = range(len(run.losses))
    return pd.DataFrame(
        {"step": steps, "loss": run.losses, "event": [";".join(events[s]) for s in steps]}
    )


def _outcome(frame: pd.DataFrame) -> int | None:
    """The onset of a guarded run: its rescue's, else its label's (None: healthy)."""
    rescue = first_rescue(frame)
    if rescue is not None:
        return rescue_label(frame, rescue).onset_step
    return label_run(frame).onset_step


def _first(run, kind: str | None) -> int | None:
    steps = [s for s, e in run.events if kind is None or e.startswith(kind)]
    return min(steps, default=None)


def _replay(args: argparse.Namespace) -> list[dict]:
    model = RiskModel.load()
    rows = []
    for name, config in _configs(args):
        with tempfile.TemporaryDirectory() as tmp:
            truth = run_scenario(config, model, False).onset
            for arm, (risk, policy, kind) in ARMS.items():
                run = run_scenario(
                    config, model if risk == "model" else "off", True, Path(tmp) / arm, policy
                )
                frame = _frame(run)
                kept, meta, censoring = censor_guarded(
                    frame, RunMeta(run_id=name, source="guarded")
                )
                steps = kept["step"].to_numpy()
                mine, usable = collapse_targets(steps, meta.onset_step, HORIZON)
                truths, _ = collapse_targets(steps, truth, HORIZON)
                # after an intervention the rows are the guarded trajectory's, labelled by
                # its own outcome: only the rows before it have the unguarded run's target
                natural = usable & (steps < (censoring.first_intervention or len(frame)))
                rows.append(
                    {
                        "config": name,
                        "arm": arm,
                        "truth": truth,
                        "fired": _first(run, kind),
                        "onset": _outcome(frame),
                        "rescue": first_rescue(frame),
                        "rows": len(frame),
                        "kept": int(usable.sum()),
                        "wrong": int((mine != truths)[natural].sum()),
                    }
                )
        print(f"{name}: unguarded onset {truth}", flush=True)
    return rows


def _before_truth(row: dict) -> bool:
    return row["fired"] is not None and (row["truth"] is None or row["fired"] < row["truth"])


def _shifts(rows: list[dict], key: str) -> str:
    both = [abs(r[key] - r["truth"]) for r in rows if r[key] is not None and r["truth"] is not None]
    return f"{statistics.median(both):.0f} / {max(both)}" if both else "-"


def _table(rows: list[dict]) -> None:
    print(
        f"\n{'arm':<11} {'fired':>5} {'label changed':>13} {'onset |d| med/max':>17} "
        f"{'rows kept':>11} {'target wrong':>12}"
    )
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        fired = [r for r in mine if _before_truth(r)]
        changed = sum((r["onset"] is None) != (r["truth"] is None) for r in fired)
        kept = f"{sum(r['kept'] for r in mine)}/{sum(r['rows'] for r in mine)}"
        print(
            f"{arm:<11} {len(fired):>5} {changed:>13} {_shifts(fired, 'onset'):>17} "
            f"{kept:>11} {sum(r['wrong'] for r in mine):>12}"
        )
    rescued = [r for r in rows if r["rescue"] is not None and r["truth"] is not None]
    lag = [r["rescue"] - r["truth"] for r in rescued]
    print(
        f"\nrescues of a run that collapses unguarded: {len(rescued)}; rescue onset vs "
        f"unguarded onset |d| med/max {_shifts(rescued, 'onset')}; rescue step - unguarded "
        f"onset median {statistics.median(lag) if lag else '-'}"
    )
    false = [r for r in rows if r["rescue"] is not None and r["truth"] is None]
    print(f"rescues of a run healthy unguarded: {len(false)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=450)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--ramps", type=float, nargs="+", default=[0.05, 0.1])
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # the guard's one-line notices, not figures
    rows = _replay(args)
    _table(rows)


if __name__ == "__main__":
    main()
