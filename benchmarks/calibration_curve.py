"""Learning curve of ``calibrate``: a model's levels set on K healthy runs of a set-up it never
saw, scored on the rest of that set-up's runs at its own stored ``warn`` level.

    python benchmarks/calibration_curve.py --runs DIR [--runs DIR ...] [--model SOURCE]
        [--by positions] [--k 0 3 5 10] [--repeats 5] [--markdown]

A set-up is a value of ``--by`` (a key of the runs' ``config``: ``positions``, ``block``,
``norm``, ``mlp``, ``family``, ``optimizer``, ...; several joined by commas, e.g.
``family,optimizer``; ``all`` pools every run as one set-up).
For each set-up, each K and each repeat (a seeded draw of K of its healthy runs), the model
is calibrated on the K runs (K = 0: the model as shipped) and scored on the set-up's other
runs: its other healthy runs and its collapses that develop (``onset_kind`` = develops;
sudden ones are the guard's reactive path, counted apart). Pooled over set-ups and repeats:

- the 200-step rule (``evaluate.event_metrics``): a collapse caught by an alarm 10-200
  steps before onset; median lead; false alarms per 10k healthy steps;
- run-level detection: a collapsing run detected by any alarm before onset - 10; the share
  of held-out healthy runs with any alarm episode (a guard acts on an early warning too);

beside the reactive rules as their originals fire them, on the same runs (they have no
levels to calibrate). ``--others`` adds a row "others": levels calibrated on the healthy runs
of every *other* set-up, scored on this one (what shipping levels calibrated on a broad
sweep of healthy runs would give on a component it never saw). Scores depend on the model
and the run only, so each run is scored once; the levels are those ``calibrate`` sets
(checked against ``RiskModel.calibrate`` on the first draw). Runs the model trained on are
refused, as ``calibrate`` refuses them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before lightgbm (docs/stack.md, "OpenMP")

import numpy as np

from collapse_guard.predictor.core.levels import alarm_starts
from collapse_guard.predictor.core.model_source import load_risk_model
from collapse_guard.predictor.core.recalibrate import healthy_levels, tail_slope
from collapse_guard.predictor.core.seen_runs import SeenRuns
from collapse_guard.predictor.evaluate import (
    ScoredRun,
    evaluate_runs,
    event_metrics,
    row_metrics,
    scored_runs,
)
from collapse_guard.predictor.evaluate.baselines import RULE_BASELINES
from collapse_guard.runfiles.records import find_run_files, load_runs

MIN_LEAD = 10


@dataclass
class Tally:
    """Pooled figures of one K over set-ups and repeats."""

    caught: int = 0
    collapses: int = 0
    leads: list[int] = field(default_factory=list)
    false_alarms: int = 0
    healthy_steps: int = 0
    detected: int = 0
    healthy_runs: int = 0
    alarmed_healthy: int = 0
    draws: int = 0

    def row(self, k: int) -> dict:
        lead = float(np.median(self.leads)) if self.leads else math.nan
        return {
            "K": k,
            "draws": self.draws,
            "caught 10-200": f"{self.caught}/{self.collapses}",
            "recall": _ratio(self.caught, self.collapses),
            "median lead": lead,
            "FA per 10k": 1e4 * self.false_alarms / self.healthy_steps
            if self.healthy_steps
            else math.nan,
            "detected (run)": _ratio(self.detected, self.collapses),
            "healthy runs alarmed": _ratio(self.alarmed_healthy, self.healthy_runs),
        }


def _ratio(a: int, b: int) -> float:
    return a / b if b else math.nan


def _group(record, by: str) -> str:
    if by == "all":
        return "all"
    return "/".join(str(record.meta.config.get(key, "unknown")) for key in by.split(","))


def _run_level(run: ScoredRun, threshold: float, tally: Tally) -> None:
    starts = run.steps[alarm_starts(run.scores, threshold)]
    if run.onset_step is None:
        tally.healthy_runs += 1
        tally.alarmed_healthy += int(starts.size > 0)
    else:
        tally.detected += int(np.any(starts <= run.onset_step - MIN_LEAD))


def _score(tally: Tally, runs: list[ScoredRun], threshold: float) -> None:
    events = event_metrics(runs, threshold)
    tally.caught += events.caught
    tally.collapses += events.n_collapsed
    tally.leads += list(events.lead_times)
    tally.false_alarms += events.false_alarms
    tally.healthy_steps += events.healthy_steps
    tally.draws += 1
    for run in runs:
        _run_level(run, threshold, tally)


def _ranking(group: str, members: list, scored_by_id: dict[str, ScoredRun]) -> dict:
    """How well the model ranks on a set-up, before any level: ROC-AUC of steps 10-200 before
    onset against healthy steps (``row_metrics``), the highest risk of its healthy runs, and
    the median over its collapses of their highest risk 10-200 steps before onset."""
    scored = [scored_by_id[r.run_id] for r in members]
    peaks = []
    for run in scored:
        if run.onset_step is not None:
            near = (run.steps >= run.onset_step - 200) & (run.steps <= run.onset_step - MIN_LEAD)
            peaks.append(np.nanmax(run.scores[near], initial=np.nan))
    healthy = [np.nanmax(r.scores) for r in scored if r.onset_step is None]
    return {
        "set-up": group,
        "runs": len(scored),
        "collapses": len(peaks),
        "ROC-AUC": row_metrics(scored).roc_auc,
        "healthy max": max(healthy, default=math.nan),
        "collapse max (median)": float(np.nanmedian(peaks)) if peaks else math.nan,
    }


def _others(groups: dict, scored: dict[str, ScoredRun], budgets) -> Tally:
    """Each set-up scored at levels calibrated on every other set-up's healthy runs."""
    tally = Tally()
    for g, members in groups.items():
        healthy = [
            scored[r.run_id].scores
            for other, rs in groups.items()
            if other != g
            for r in rs
            if r.meta.onset_step is None
        ]
        if healthy:
            warn = healthy_levels(healthy, budgets)["warn"].threshold
            _score(tally, [scored[r.run_id] for r in members], warn)
    return tally


def _baselines(records) -> list[dict]:
    report = evaluate_runs(records, None, [b() for b in RULE_BASELINES], groupings=())
    rows = []
    for baseline in RULE_BASELINES:
        name = baseline().name
        ev = report.result(name, "all").events
        rows.append(
            {
                "rule": name,
                "caught 10-200": f"{ev.caught}/{ev.n_collapsed}",
                "recall": ev.recall,
                "median lead": ev.median_lead,
                "FA per 10k": ev.fa_per_10k,
            }
        )
    return rows


def _print(rows: list[dict], markdown: bool) -> None:
    if not rows:
        return
    cols = list(rows[0])

    def cell(v):
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    if markdown:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(cell(r[c]) for c in cols) + " |")
    else:
        print("  ".join(f"{c:>20}" for c in cols))
        for r in rows:
            print("  ".join(f"{cell(r[c]):>20}" for c in cols))
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", action="extend", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--by", default="positions")
    parser.add_argument("--k", nargs="+", type=int, default=[0, 3, 5, 10])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--others", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)

    model = load_risk_model(args.model)
    seen = SeenRuns.from_meta(model.meta)
    records = [r for r in load_runs(find_run_files(args.runs)) if seen.role_of(r.run_id) != "train"]
    onset = {r.run_id: r.meta.extra.get("onset_kind") for r in records}
    kept = [r for r in records if r.meta.onset_step is None or onset[r.run_id] == "develops"]
    sudden = len(records) - len(kept)
    risks = [model.predict_run(r.frame, steps=r.frame["step"].to_numpy()) for r in kept]
    scored = {s.run_id: s for s in scored_runs(kept, risks)}
    groups: dict[str, list] = defaultdict(list)
    for r in kept:
        groups[_group(r, args.by)].append(r)
    print(
        f"model {model.meta['version']}, stored warn {model.thresholds['warn']:.3f}; "
        f"{len(kept)} runs ({sum(r.meta.onset_step is not None for r in kept)} develop, "
        f"{sudden} sudden left out) in {len(groups)} set-ups by {args.by}: "
        + ", ".join(
            f"{g} {sum(r.meta.onset_step is None for r in rs)}h/"
            f"{sum(r.meta.onset_step is not None for r in rs)}c"
            for g, rs in sorted(groups.items())
        )
    )
    _print([_ranking(g, rs, scored) for g, rs in sorted(groups.items())], args.markdown)
    slopes = {
        g: tail_slope(
            np.concatenate([scored[r.run_id].scores for r in rs if r.meta.onset_step is None])
        )
        for g, rs in sorted(groups.items())
        if any(r.meta.onset_step is None for r in rs)
    }
    print(
        "tail slope of healthy risk, log-odds a decade: "
        + ", ".join(f"{g} {s:.2f}" for g, s in slopes.items())
    )
    tallies = {k: Tally() for k in args.k}
    checked = False
    for _, members in sorted(groups.items()):
        healthy = [r for r in members if r.meta.onset_step is None]
        for k in args.k:
            if k and len(healthy) < k + 1:
                continue  # no healthy run left to score: this set-up has too few
            for repeat in range(args.repeats if k else 1):
                rng = np.random.default_rng([args.seed, repeat, k])
                chosen = {healthy[i].run_id for i in rng.choice(len(healthy), k, replace=False)}
                thresholds = model.thresholds
                if k:
                    evidence = healthy_levels([scored[i].scores for i in chosen], model.budgets)
                    thresholds = {lv: e.threshold for lv, e in evidence.items()}
                    if not checked:  # the public API sets the same levels
                        tuned = model.calibrate([r for r in healthy if r.run_id in chosen])
                        # to the last bits: the API scores the runs again, summed in
                        # another order
                        assert all(
                            math.isclose(tuned.thresholds[lv], t, rel_tol=1e-12)
                            for lv, t in thresholds.items()
                        ), (tuned.thresholds, thresholds)
                        checked = True
                test = [scored[r.run_id] for r in members if r.run_id not in chosen]
                _score(tallies[k], test, thresholds["warn"])
    rows = [t.row(k) for k, t in tallies.items()]
    if args.others:
        rows.append(_others(groups, scored, model.budgets).row("others"))
    print(f"calibrate, by {args.by}: pooled over set-ups and {args.repeats} draws of K runs")
    _print(rows, args.markdown)
    print("reactive rules as their originals fire them, on every kept run")
    _print(_baselines(kept), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
