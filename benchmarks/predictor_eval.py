"""Issue 4's target figures for a model on a folder of runs, per data source.

    python benchmarks/predictor_eval.py --runs DIR [--runs DIR ...] [--model SOURCE]
                                        [--all-runs] [--markdown] [--budget FA]

By default only the model's own test runs are scored (their ids are stored in the
model's meta by ``train_risk_model``), so a model is never graded on runs it was
trained on; ``--all-runs`` scores every run given (for runs the model never saw). The
config-only baseline is fitted on the model's training runs when they are among the
runs given, and left out otherwise.

Targets (issue 4, on the test split of real runs): recall >= 0.8 at <= 1 false alarm
per 10k healthy steps, with >= 10 steps of warning; median lead time >= 50 steps;
recall >= 2x the best baseline's at the same budget; Brier score reported.

Printed: the target table (one row per source); caught collapses per kind, by the
label's kind and by the generator's cause, for the model and every baseline at the
same budget ("recall (median lead)"); and the lead per signal family
(``evaluation.family_leads``: the share of collapses of each kind on which a family
left its run's healthy range at least 10 steps before onset, and the median lead of
those), beside the healthy-control row (the same rule on healthy runs) and a line per
kind the model misses. ``--markdown`` prints every table again as Markdown, for
benchmarks/README.md.
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


def _pair(share, lead) -> str:
    """'0.85 (120)': a recall or share and the median lead in steps."""
    if share is None or (isinstance(share, float) and math.isnan(share)):
        return "—"
    if lead is None or (isinstance(lead, float) and math.isnan(lead)):
        return f"{share:.2f}"
    return f"{share:.2f} ({lead:.0f})"


def kind_rows(report, grouping: str = "kind", source: str = "all") -> list[dict]:
    """One row per collapse kind: n, then 'recall (median lead)' for every scorer at the budget."""
    wide = report.kind_table(grouping, source=source)
    scorers = [c.removesuffix(" recall") for c in wide.columns if c.endswith(" recall")]
    return [
        {
            grouping: kind,
            "n": int(row["n"]),
            **{s: _pair(row[f"{s} recall"], row[f"{s} lead"]) for s in scorers},
        }
        for kind, row in wide.iterrows()
    ]


def family_rows(report, leads, by: str = "kind", source: str = "all") -> list[dict]:
    """One row per kind (healthy control last): n, how many of those have a healthy range
    (onset late enough), the model's 'recall (lead)', then per family 'share warned
    (median lead)' over the runs where the family has a range ('—': none has); families
    no run measured are left out."""
    from collapse_guard.predictor.evaluation import HEALTHY_CONTROL, family_lead_table

    if source != "all":
        leads = leads[leads["source"] == source]
    table = family_lead_table(leads, by=by)
    measured = table.groupby("family", sort=False)["n"].sum()
    families = [f for f, n in measured.items() if n > 0]
    has_model = "model" in report.kinds_frame()["scorer"].values
    model = report.kind_table(by, source=source) if has_model else None
    rows = []
    for kind, group in table.groupby(by, sort=False):
        group = group.set_index("family")
        of_kind = leads[leads[by] == kind]
        row = {
            by: kind,
            "n": int(of_kind["run_id"].nunique()),
            # runs long enough before onset for a healthy range of any signal
            "with range": int(of_kind.loc[of_kind["n_signals"] > 0, "run_id"].nunique()),
        }
        if model is not None:
            in_model = kind != HEALTHY_CONTROL and kind in model.index
            row["model"] = (
                _pair(model.loc[kind, "model recall"], model.loc[kind, "model lead"])
                if in_model
                else "—"
            )
        for family in families:
            row[family] = _pair(group.loc[family, "share"], group.loc[family, "median_lead"])
        rows.append(row)
    return rows


def missed_lines(report, leads, by: str = "kind", target: float = TARGET_RECALL) -> list[str]:
    """One sentence per kind the model catches less than ``target`` of: which families
    departed in time on it, and how often they do on healthy runs."""
    from collapse_guard.predictor.evaluation import HEALTHY_CONTROL, family_lead_table

    table = family_lead_table(leads, by=by)
    control = table[table[by] == HEALTHY_CONTROL].set_index("family")["share"]
    wide = report.kind_table(by)
    lines = []
    for kind, row in wide.iterrows():
        if not row["model recall"] < target:
            continue
        fam = table[(table[by] == kind) & (table["n"] > 0)].sort_values("share", ascending=False)
        parts = [
            f"{r.family} {r.share:.0%}"
            + (f" ({r.median_lead:.0f} steps, {r.top_signal})" if r.warned else "")
            + (f" vs {control[r.family]:.0%} healthy" if r.family in control else "")
            for r in fam.itertuples()
            if r.share > 0
        ]
        caught = f"{row['model recall']:.0%} of {int(row['n'])}"
        lines.append(
            f"{by} {kind}: model catches {caught}; families departing >= 10 steps ahead: "
            + (", ".join(parts) if parts else "none")
        )
    return lines


def markdown_table(title: str, rows: list[dict]) -> str:
    """A bold title line and a Markdown table of ``rows`` (dicts with the same keys)."""
    lines = [f"**{title}**", ""]
    if rows:
        lines.append("| " + " | ".join(rows[0]) + " |")
        lines.append("|" + "---|" * len(rows[0]))
        lines += ["| " + " | ".join(_fmt(v) for v in row.values()) + " |" for row in rows]
    else:
        lines.append("(no rows)")
    return "\n".join(lines) + "\n"


def _print_table(console, title: str, rows: list[dict], markdown: list[str]) -> None:
    """Print ``rows`` as a rich table; append its Markdown to ``markdown``."""
    from rich.table import Table

    markdown.append(markdown_table(title, rows))
    if not rows:
        console.print(f"{title}: no rows")
        return
    table = Table(title=title)
    for i, key in enumerate(rows[0]):
        table.add_column(key, justify="left" if i == 0 or key == "best_baseline" else "right")
    for row in rows:
        table.add_row(*(_fmt(v) for v in row.values()))
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, action="append", required=True, metavar="DIR")
    parser.add_argument("--model", default=None, help="omitted: bundled; a URI or a folder")
    parser.add_argument("--all-runs", action="store_true", help="score every run given")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    parser.add_argument(
        "--budget",
        type=float,
        default=1.0,
        metavar="FA",
        help="false alarms per 10k healthy steps for recall at budget (the target's: 1)",
    )
    args = parser.parse_args(argv)

    import pandas as pd
    from rich.console import Console

    from collapse_guard.predictor.baselines import default_baselines
    from collapse_guard.predictor.cli import run_paths
    from collapse_guard.predictor.evaluation import (
        CONTROL_RATE,
        DEPARTURE_STD,
        KIND_GROUPINGS,
        REFERENCE_STEPS,
        evaluate_runs,
        family_leads,
    )
    from collapse_guard.predictor.risk import RiskModel
    from collapse_guard.predictor.training_data import load_runs

    console = Console(width=160)
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
    report = evaluate_runs(
        runs, model, baselines, budget_per_10k=args.budget, horizon=model.horizon
    )
    rows = target_rows(report)
    sources = sorted({r.meta.source for r in runs})
    # each source calibrated on its own healthy runs: real and synthetic drift differently
    per_source = {
        s: family_leads([r for r in runs if r.meta.source == s], horizon=model.horizon)
        for s in sources
    }
    leads = pd.concat(per_source.values(), ignore_index=True)
    md: list[str] = []  # the same tables, in Markdown, printed last with --markdown

    title = (
        f"model {model.meta['version']} on {len(runs)} runs "
        f"({'all given' if args.all_runs else 'its test split'}), at "
        f"{report.budget_per_10k:g} false alarm per 10k healthy steps"
    )
    _print_table(console, title, rows, md)
    targets = (
        f"targets: recall >= {TARGET_RECALL}, median lead >= {TARGET_LEAD:g} steps, "
        f"recall >= {TARGET_RATIO:g}x best baseline"
    )
    console.print(targets)
    md.append(targets + "\n")
    shown = ["all", *sources] if len(sources) > 1 else ["all"]
    for source in shown:
        for grouping in KIND_GROUPINGS:
            _print_table(
                console,
                f"caught per collapse {grouping} ({source}), recall (median lead) at the budget",
                kind_rows(report, grouping, source),
                md,
            )
    for source in shown:
        for by in KIND_GROUPINGS:
            _print_table(
                console,
                f"lead per signal family ({source}), by {by}: share of collapses warned >= "
                f"{report.min_lead} steps ahead (median lead)",
                family_rows(report, leads, by, source),
                md,
            )
    multiples = {
        s: {k: round(v, 1) for k, v in f.attrs["n_std"].items() if v != DEPARTURE_STD}
        for s, f in per_source.items()
    }
    definition = (
        f"departure: beyond mean ± {DEPARTURE_STD:g} std of the run's own steps in "
        f"[onset - H - W, onset - H), H = {model.horizon}, W = {REFERENCE_STEPS}; the multiple "
        f"raised where a source's healthy runs would depart more than {CONTROL_RATE:.0%} of "
        f"the time: {multiples} (so the healthy-control row is in-sample: at most that rate "
        "per signal)"
    )
    console.print(definition)
    md.append(definition + "\n")
    for by in KIND_GROUPINGS:
        for line in missed_lines(report, leads, by):
            console.print(line)
            md.append(f"- {line}")
    if args.markdown:
        print("\n" + "\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
