"""Issue 4's target figures for a model on a folder of runs, per data source.

    python benchmarks/predictor_eval.py --runs DIR [--runs DIR ...] [--model SOURCE]
                                        [--all-runs] [--markdown]

By default only the model's own test runs are scored (their ids are stored in the
model's meta by ``train_risk_model``), so a model is never graded on runs it was
trained on; ``--all-runs`` scores every run given (for runs the model never saw). The
config-only baseline is fitted on the model's training runs when they are among the
runs given, and left out otherwise.

Targets (issue 4, on the test split of real runs): recall >= 0.8 at <= 1 false alarm
per 10k healthy steps, with >= 10 steps of warning; median lead time >= 50 steps;
recall >= 2x the best baseline's at the same budget; Brier score reported.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

# before lightgbm is imported: spinning OpenMP threads make a busy machine crawl
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

TARGET_RECALL, TARGET_LEAD, TARGET_RATIO = 0.8, 50.0, 2.0


def target_rows(report) -> list[dict]:
    """One row per source: the model at the budget beside the best baseline at the budget."""
    frame = report.to_frame()
    at_budget = frame[frame["operating_point"] == "budget"]
    rows = []
    for source, group in at_budget.groupby("source", sort=False):
        model = group[group["scorer"] == "model"].iloc[0]
        baselines = group[group["scorer"] != "model"].sort_values("recall", ascending=False)
        best = baselines.iloc[0] if len(baselines) else None
        best_recall = best["recall"] if best is not None else math.nan
        if best_recall > 0:
            ratio = model["recall"] / best_recall
        else:
            ratio = math.inf if model["recall"] > 0 else math.nan
        rows.append(
            {
                "source": source,
                "runs": int(model["n_runs"]),
                "collapses": int(model["n_collapsed"]),
                "recall": model["recall"],
                "caught": f"{model['caught']}/{model['n_collapsed']}",
                "median_lead": model["median_lead"],
                "fa_per_10k": model["fa_per_10k"],
                "best_baseline": "—" if best is None else f"{best['scorer']} {best_recall:.2f}",
                "ratio": ratio,
                "brier": model["brier"],
                "pr_auc": model["pr_auc"],
                "meets": model["recall"] >= TARGET_RECALL
                and model["median_lead"] >= TARGET_LEAD
                and ratio >= TARGET_RATIO,
            }
        )
    return rows


def _fmt(value) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else "inf" if math.isinf(value) else f"{value:.3g}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, action="append", required=True, metavar="DIR")
    parser.add_argument("--model", default=None, help="omitted: bundled; a URI or a folder")
    parser.add_argument("--all-runs", action="store_true", help="score every run given")
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from collapse_guard.predictor.baselines import default_baselines
    from collapse_guard.predictor.cli import run_paths
    from collapse_guard.predictor.evaluation import evaluate_runs
    from collapse_guard.predictor.risk import RiskModel
    from collapse_guard.predictor.training_data import load_runs

    console = Console(width=140)
    model = RiskModel.load(args.model)
    runs = load_runs(run_paths(args.runs))
    split = model.meta.get("split", {})
    train_runs = [r for r in runs if r.run_id in set(split.get("train", ()))]
    if not args.all_runs:
        if not split:
            raise SystemExit(
                f"model {model.meta['version']} stores no split, so its test runs are unknown; "
                "pass --all-runs with runs it was not trained on"
            )
        runs = [r for r in runs if r.run_id in set(split["test"])]
        if not runs:
            raise SystemExit(
                f"none of the model's {len(split['test'])} test runs is under {args.runs}; "
                "pass the folders it was trained on, or --all-runs with unseen runs"
            )
    baselines = default_baselines(train_runs or None, horizon=model.horizon)
    report = evaluate_runs(runs, model, baselines, horizon=model.horizon)
    rows = target_rows(report)

    title = (
        f"model {model.meta['version']} on {len(runs)} runs "
        f"({'all given' if args.all_runs else 'its test split'}), at "
        f"{report.budget_per_10k:g} false alarm per 10k healthy steps"
    )
    table = Table(title=title)
    for key in rows[0]:
        table.add_column(key, justify="left" if key in ("source", "best_baseline") else "right")
    for row in rows:
        table.add_row(*(_fmt(v) for v in row.values()))
    console.print(table)
    console.print(
        f"targets: recall >= {TARGET_RECALL}, median lead >= {TARGET_LEAD:g} steps, "
        f"recall >= {TARGET_RATIO:g}x best baseline"
    )
    if args.markdown:
        print("| " + " | ".join(rows[0]) + " |")
        print("|" + "---|" * len(rows[0]))
        for row in rows:
            print("| " + " | ".join(_fmt(v) for v in row.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
