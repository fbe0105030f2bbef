"""Issue 8's honest evaluation of a model on a folder of runs: out of sample, per source.

    python benchmarks/predictor_eval.py --runs DIR [--runs DIR ...] [--model SOURCE]
        [--leave-one-out family|optimizer|data] [--no-synthetic] [--gain K]
        [--budget FA] [--separability] [--ablate all|GROUP,GROUP] [--add-groups GROUP,GROUP]
        [--extra-context all|FIELD,FIELD] [--markdown]

Scored: only the runs the model never trained or validated on (their ids are stored in
the model's meta); its training and validation runs among those given fit the learned
baselines (config-only, tuned attention thresholds) and are never scored.

Printed:

1. the headline per source: the model at its **stored `warn` level** (set on validation
   runs at training): recall, median lead, false alarms per 10k healthy steps, beside
   the best baseline at its own out-of-sample point (a rule as its original fires it, a
   tuned baseline at its validation threshold); then, secondary and labelled so, recall
   at a threshold fitted on these test runs for ``--budget`` false alarms per 10k healthy
   steps, for the model and the best baseline (ROC-like; per-source thresholds);
2. whether the stored levels hold their budgets on each source within a factor of 2;
   inside LR rises and outside (the LR rose within the last H steps, ``features.rises``),
   per source: every scorer at its out-of-sample points (the model at each stored level),
   false alarms per 10k healthy steps and the step ROC-AUC on each side (``rise_rows``);
3. caught collapses per kind, cause and onset (``sudden`` apart from ``develops``), and
   per model family / optimizer / data where there are several;
4. the lead per signal group (``group_leads.group_leads``), and a line per kind missed;
   per optimizer, model family and data, the collapses that develop beside the set-up's
   own healthy runs (``group_leads.setup_lead_table``; model-free, over every run given);
   with ``--separability``, per set-up how well each signal group's best single feature
   tells pre-collapse rows from healthy ones, over every row, inside LR rises and outside
   (``separability``; ``--add-groups`` scores groups the model does not read too);
5. the top features by gain (``--gain``, default 20: the synthetic-artefact check);
6. with ``--leave-one-out family``: a model trained without each family, tested on it,
   each family and the mean beside the baselines (``training.holdout.leave_one_group_out``),
   and each fold's model inside LR rises and outside (``holdout_rise_rows``);
7. with ``--ablate``: the model with every signal, then without each signal group named
   (``all``: every group it reads), each leave-one-out (``--leave-one-out``'s grouping,
   else family), inside LR rises and outside (``group_leads.signal_group_ablation``);
   ``--add-groups`` adds the model with each signal group it does not read (``optimizer``:
   the optimizer-state family, issue 34 item 4); ``--extra-context`` the model with each
   opt-in run-context field named
   (``all``: every one of ``features.context_fields.OPT_IN_CONTEXT``), and with all of
   them; alone (without ``--ablate``) it runs only those beside the model as it is.

Targets (issue 8, held-out families, at the stored `warn` level): recall >= 0.8 of the
collapses that develop, median lead >= 50 steps, <= 1 false alarm per 10k healthy steps;
over all collapses, recall >= 2x the best baseline's at the same false-alarm rate.
Issue 34's inside LR rises: at most 2 false alarms per 10k healthy steps at `warn`, step
ROC-AUC there at least 0.9. ``--markdown`` prints every table again as Markdown, for
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

__all__ = [
    "budget_rows",
    "gain_rows",
    "group_rows",
    "holdout_rise_rows",
    "holdout_rows",
    "kind_rows",
    "main",
    "markdown_table",
    "missed_lines",
    "rise_rows",
    "separability_rows",
    "setup_group_rows",
    "target_rows",
]

# before lightgbm is imported: spinning OpenMP threads make a busy machine crawl
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

TARGET_RECALL, TARGET_LEAD, TARGET_FA, TARGET_RATIO = 0.8, 50.0, 1.0, 2.0
TARGET_RISE_FA, TARGET_RISE_AUC = 2.0, 0.9  # issue 34: inside LR rises, at warn


def _ratio(ours: float, theirs: float) -> float:
    if theirs > 0:
        return ours / theirs
    return math.inf if ours > 0 else math.nan


def _best(report, source: str, point: str | None) -> tuple[str, float, float]:
    """(name, recall, FA/10k) of the baseline with the best recall at ``point`` (None:
    each at its own headline point)."""
    best, recall, fa = "—", math.nan, math.nan
    for scorer in report.scorers:
        if scorer == "model":
            continue
        events = report.result(scorer, source, point or "headline").events
        if not recall >= events.recall:  # NaN-safe: the first finite recall wins over NaN
            best, recall, fa = scorer, events.recall, events.fa_per_10k
    return best, recall, fa


def _at(name: str, recall: float, fa: float) -> str:
    """'zclip 0.92 @211': a scorer's recall at its false alarms per 10k healthy steps;
    'none' when no baseline catches anything."""
    if name == "—":
        return "—"
    return f"{name} {recall:.2f} @{fa:.3g}" if recall > 0 else "none"


def target_rows(report) -> list[dict]:
    """One row per source: the model at its stored warn level beside the best baseline at
    its own point, then the ROC-like comparison at the budget (thresholds fitted on these
    runs, per source)."""
    sources = list(dict.fromkeys(r.source for r in report.results))
    rows = []
    for source in sources:
        warn = report.result("model", source)
        roc = report.result("model", source, "budget")
        name, recall, fa = _best(report, source, None)
        roc_name, roc_recall, roc_fa = _best(report, source, "budget")
        ev = warn.events
        rows.append(
            {
                "source": source,
                "runs": ev.n_runs,
                "collapses": ev.n_collapsed,
                "warn recall": ev.recall,
                "caught": f"{ev.caught}/{ev.n_collapsed}",
                "lead": ev.median_lead,
                "FA/10k": ev.fa_per_10k,
                "best baseline (own point) @FA": _at(name, recall, fa),
                "ROC-like recall": roc.events.recall,
                "ROC-like best baseline @FA": _at(roc_name, roc_recall, roc_fa),
                "ROC-like ratio": _ratio(roc.events.recall, roc_recall),
                "brier": warn.rows.brier,
                "pr_auc": warn.rows.pr_auc,
                **_rise_cells(warn.flat()),
            }
        )
    return rows


def _rise_cells(row) -> dict:
    """FA/10k and step ROC-AUC inside LR rises and outside, of one flat report row."""
    return {
        "FA/10k in rises": row["inside_fa_per_10k"],
        "FA/10k outside": row["outside_fa_per_10k"],
        "AUC in rises": row["inside_roc_auc"],
        "AUC outside": row["outside_roc_auc"],
    }


def _steps_cells(row) -> dict:
    """Runs with an LR and healthy steps on each side, of one row with RISE_COLUMNS."""
    return {
        "runs with LR": int(row["runs_with_lr"]),
        "healthy in rises": int(row["inside_healthy_steps"]),
        "healthy outside": int(row["outside_healthy_steps"]),
    }


def rise_rows(report, source: str = "all") -> list[dict]:
    """Inside LR rises and outside: one row per scorer at each out-of-sample point (the
    model at each stored level); none where no run records an LR."""
    frame = report.rise_frame(source)
    frame = frame[frame["runs_with_lr"] > 0]
    return [
        {
            "scorer": r["scorer"],
            "point": r["operating_point"],
            **_steps_cells(r),
            **_rise_cells(r),
        }
        for _, r in frame.iterrows()
    ]


def holdout_rise_rows(holdout) -> list[dict]:
    """One row per held-out group (then the mean): its model at the stored warn level
    inside LR rises and outside; none where no held-out run records an LR."""
    from collapse_guard.predictor.evaluate import fold_rise_frame

    frame = fold_rise_frame(holdout.folds)
    frame = frame[frame["runs_with_lr"] > 0]
    return [
        {holdout.grouping: r["group"], **_steps_cells(r), **_rise_cells(r)}
        for _, r in frame.iterrows()
    ]


def budget_rows(report) -> list[dict]:
    """One row per (source, level): the stored level's false alarms against its budget."""
    return [
        {
            "source": c.source,
            "level": c.level,
            "budget/10k": c.budget_per_10k,
            "FA/10k": c.fa_per_10k,
            "false alarms": c.false_alarms,
            "healthy steps": c.healthy_steps,
            "within 2x": {True: "yes", False: "no", None: "too few steps"}[c.holds],
        }
        for c in report.budget_checks
    ]


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
    """One row per group: n, then 'recall (median lead)' for every scorer at its own
    headline point (the model at its stored warn level)."""
    wide = report.group_table(grouping, source=source)
    scorers = [c.removesuffix(" recall") for c in wide.columns if c.endswith(" recall")]
    return [
        {
            grouping: kind,
            "n": int(row["n"]),
            **{s: _pair(row[f"{s} recall"], row[f"{s} lead"]) for s in scorers},
        }
        for kind, row in wide.iterrows()
    ]


def group_rows(report, leads, by: str = "kind", source: str = "all") -> list[dict]:
    """One row per kind (healthy control last): n, how many of those have a healthy range
    (onset late enough), the model's 'recall (lead)', then per signal group 'share warned
    (median lead)' over the runs where the group has a range ('—': none has); groups
    no run measured are left out."""
    from group_leads import HEALTHY_CONTROL, group_lead_table

    if source != "all":
        leads = leads[leads["source"] == source]
    table = group_lead_table(leads, by=by)
    measured = table.groupby("signal_group", sort=False)["n"].sum()
    signal_groups = [f for f, n in measured.items() if n > 0]
    model = report.group_table(by, source=source) if "model" in report.scorers else None
    rows = []
    for kind, group in table.groupby(by, sort=False):
        group = group.set_index("signal_group")
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
        for name in signal_groups:
            row[name] = _pair(group.loc[name, "share"], group.loc[name, "median_lead"])
        rows.append(row)
    return rows


def setup_group_rows(leads, by: str) -> list[dict]:
    """Per set-up group (``by``: optimizer, model_family, data), its collapses that develop
    beside its own healthy runs: runs, then per signal group the share that departed in
    time (``group_leads.setup_lead_table``); signal groups no run measured are left out."""
    from group_leads import setup_lead_table

    table = setup_lead_table(leads, by=by).dropna(axis=1, how="all")
    return [
        {
            by: group,
            "runs": "healthy" if control else "develop",
            "n": int(row["runs"]),
            **{f: _pair(row[f], None) for f in table.columns if f != "runs"},
        }
        for (group, control), row in table.iterrows()
    ]


def _auc(auc, floor) -> str:
    """'0.97 (0.80)': a ROC-AUC and, where measured, its noise floor; '—' where none."""
    if auc is None or math.isnan(auc):
        return "—"
    return f"{auc:.2f}" if math.isnan(floor) else f"{auc:.2f} ({floor:.2f})"


def separability_rows(table, by: str, null=None) -> list[dict]:
    """One row per signal group, one column per set-up group of ``by``: the direction-free
    ROC-AUC of the signal group's best single feature there (``separability``), and in
    brackets its score with the runs' outcomes shuffled (``null``, the same table made on
    ``separability.permuted_targets``), then a row of each group's rows (positives)."""
    wide = table.pivot(index="signal_group", columns="group", values="auc")
    floor = wide * math.nan
    if null is not None:
        floor = null.pivot(index="signal_group", columns="group", values="auc")
        floor = floor.reindex(index=wide.index, columns=wide.columns)
    rows = [
        {"signals": name, **{g: _auc(wide.at[name, g], floor.at[name, g]) for g in wide.columns}}
        for name in wide.index
    ]
    sizes = table.groupby("group")[["rows", "positives"]].first()
    rows.append(
        {
            "signals": "rows (pre-collapse)",
            **{g: f"{r.rows} ({r.positives})" for g, r in sizes.iterrows()},
        }
    )
    return rows


def missed_lines(report, leads, by: str = "kind", target: float = TARGET_RECALL) -> list[str]:
    """One sentence per kind the model catches less than ``target`` of: which signal
    groups departed in time on it, and how often they do on healthy runs."""
    from group_leads import HEALTHY_CONTROL, group_lead_table

    table = group_lead_table(leads, by=by)
    control = table[table[by] == HEALTHY_CONTROL].set_index("signal_group")["share"]
    wide = report.group_table(by)
    lines = []
    for kind, row in wide.iterrows():
        if not row["model recall"] < target:
            continue
        of_kind = table[(table[by] == kind) & (table["n"] > 0)]
        parts = [
            f"{r.signal_group} {r.share:.0%}"
            + (f" ({r.median_lead:.0f} steps, {r.top_signal})" if r.warned else "")
            + (f" vs {control[r.signal_group]:.0%} healthy" if r.signal_group in control else "")
            for r in of_kind.sort_values("share", ascending=False).itertuples()
            if r.share > 0
        ]
        caught = f"{row['model recall']:.0%} of {int(row['n'])}"
        lines.append(
            f"{by} {kind}: model catches {caught}; signal groups departing >= 10 steps ahead: "
            + (", ".join(parts) if parts else "none")
        )
    return lines


def gain_rows(model, k: int) -> list[dict]:
    """The model's top-``k`` features by gain (``importance.feature_gain_table``)."""
    from importance import feature_gain_table

    table = feature_gain_table(model, k)
    return [
        {"feature": r.feature, "signal": r.signal, "share": f"{r.share:.1%}", "splits": r.splits}
        for r in table.itertuples()
    ]


def holdout_rows(holdout) -> list[dict]:
    """One row per held-out group (then the mean): 'recall (median lead) @FA/10k' per
    scorer at its own out-of-sample point (a rule that catches much at 200 false alarms
    per 10k healthy steps is no alternative: the false-alarm rate says so)."""
    recall, lead = holdout.wide("recall"), holdout.wide("median_lead")
    fa = holdout.wide("fa_per_10k")
    frame = holdout.frame()
    n = frame[frame["scorer"] == "model"].set_index("group")["n_collapsed"]
    return [
        {
            holdout.grouping: group,
            "collapses": int(n[group]),
            **{
                s: f"{_pair(recall.loc[group, s], lead.loc[group, s])} @{fa.loc[group, s]:.3g}"
                for s in recall.columns
            },
        }
        for group in recall.index
    ]


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
        text = i == 0 or "baseline" in key or key in ("feature", "signal", "level")
        table.add_column(key, justify="left" if text else "right")
    for row in rows:
        table.add_row(*(_fmt(v) for v in row.values()))
    console.print(table)


def _leads_per_source(runs, horizon: int) -> dict:
    """Source -> ``group_leads.group_leads`` of its runs: each source calibrated on its
    own healthy runs (real and synthetic drift differently)."""
    from group_leads import group_leads

    sources = sorted({r.meta.source for r in runs})
    return {
        s: group_leads([r for r in runs if r.meta.source == s], horizon=horizon) for s in sources
    }


def _groups(text: str | None) -> list[str]:
    """A comma list of signal groups (``--add-groups``) as a list; [] for none."""
    return [g for g in (text or "").split(",") if g]


def _separability_extractor(model, add: list[str]):
    """The model's own features, or with ``add``'s signal groups read too (those the
    model does not read: the optimizer-state family)."""
    from group_leads import signal_groups

    from collapse_guard.features import FeatureExtractor
    from collapse_guard.features.context import opt_in_of

    schema = model.schema
    if not add:
        return FeatureExtractor.from_schema(schema)
    extra = tuple(s for s, g in signal_groups().items() if g in add and s not in schema.signals)
    return FeatureExtractor(schema.window, (*schema.signals, *extra), opt_in_of(schema.context))


def _rise_columns(group, inside) -> list[tuple]:
    """(rows, set-up names) of the separability table's columns: every row under its
    set-up's name, those inside LR rises as "<set-up> in rises", the rest "<set-up> outside"."""
    import numpy as np

    group = group.astype(str)
    return [
        (np.ones(len(group), dtype=bool), group),
        (inside, np.char.add(group[inside], " in rises")),
        (~inside, np.char.add(group[~inside], " outside")),
    ]


def _print_separability(console, records, model, md: list[str], add: list[str]) -> None:
    """Per optimizer, model family and data (where several), how well each signal
    group's best single feature tells pre-collapse rows from healthy ones: over every
    row, inside LR rises and outside (issue 34, item 5)."""
    import numpy as np
    import pandas as pd
    from separability import permuted_targets, separability

    from collapse_guard.features.rises import rows_in_lr_rise
    from collapse_guard.predictor.evaluate import setup_of
    from collapse_guard.predictor.training.data import build_training_data

    extractor = _separability_extractor(model, add)
    data = build_training_data(records, extractor, horizon=model.horizon)
    meta = {r.run_id: r.meta for r in records}
    inside = rows_in_lr_rise(data.groups, data.steps, {r.run_id: r.frame for r in records})
    for by in ("optimizer", "family", "data"):
        group = np.array([setup_of(meta[i], by) for i in data.groups])
        if len(set(group)) < 2:
            continue
        shuffled = permuted_targets(data.y, data.groups, data.steps, group)
        columns = _rise_columns(group, inside)
        true, null = (
            pd.concat(
                [separability(data.X.loc[rows], y[rows], setups) for rows, setups in columns],
                ignore_index=True,
            )
            for y in (data.y, shuffled)
        )
        _print_table(
            console,
            f"separability per {by}, all {len(records)} runs given (model-free): ROC-AUC of "
            "each signal group's best single feature, pre-collapse rows against healthy "
            "ones (0.5: no information), over every row, inside LR rises and outside; in "
            "brackets the same with the runs' outcomes shuffled within each column's set-up "
            "(the noise floor)",
            separability_rows(true, by, null),
            md,
        )


def _print_ablation(console, records, args, md: list[str]) -> None:
    """The model with every signal, without each signal group named by ``--ablate`` and
    with each opt-in context field named by ``--extra-context``, leave-one-out, inside LR
    rises and outside."""
    from group_leads import signal_group_ablation

    from collapse_guard.features.context_fields import OPT_IN_CONTEXT

    by = args.leave_one_out or "family"
    runs = records if args.synthetic else [r for r in records if r.meta.source != "synthetic"]
    drop = [] if not args.ablate else None if args.ablate == "all" else args.ablate.split(",")
    extra = args.extra_context or ""
    table = signal_group_ablation(
        runs,
        by=by,
        drop=drop,
        add=_groups(args.add_groups),
        extra_context=OPT_IN_CONTEXT if extra == "all" else [n for n in extra.split(",") if n],
        eval_budget_per_10k=args.budget,
        progress=console.log,
    )
    _print_table(
        console,
        f"signal-group ablation, leave-one-{by}-out: the model at its stored warn level, "
        f"mean over held-out {by} values, inside LR rises and outside",
        table.to_dict("records"),
        md,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, action="append", required=True, metavar="DIR")
    parser.add_argument("--model", default=None, help="omitted: bundled; a URI or a folder")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    parser.add_argument(
        "--separability",
        action="store_true",
        help="per set-up, how well each signal group alone separates (every run given)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=1.0,
        metavar="FA",
        help="false alarms per 10k healthy steps of the ROC-like rows (the target's: 1)",
    )
    parser.add_argument("--gain", type=int, default=20, metavar="K", help="top-K features")
    parser.add_argument(
        "--leave-one-out",
        choices=("family", "optimizer", "data"),
        default=None,
        help="also train without each group and test on it",
    )
    parser.add_argument(
        "--ablate",
        default=None,
        metavar="GROUPS",
        help="also train leave-one-out without each signal group (comma list, or 'all'), "
        "read inside LR rises and outside",
    )
    parser.add_argument(
        "--add-groups",
        default=None,
        metavar="GROUPS",
        help="ablation: also train leave-one-out with each signal group the model does not "
        "read (comma list, e.g. optimizer); with --separability, score those groups too",
    )
    parser.add_argument(
        "--extra-context",
        default=None,
        metavar="FIELDS",
        help="ablation: also train leave-one-out with each opt-in run-context field (comma "
        "list, or 'all'; features.context_fields.OPT_IN_CONTEXT) and with all of them",
    )
    parser.add_argument(
        "--no-synthetic",
        dest="synthetic",
        action="store_false",
        help="with --leave-one-out: train on real runs only",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    import pandas as pd
    from group_leads import CONTROL_RATE, DEPARTURE_STD, REFERENCE_STEPS
    from rich.console import Console

    from collapse_guard.predictor.core.risk import RiskModel
    from collapse_guard.predictor.core.seen_runs import SeenRuns
    from collapse_guard.predictor.evaluate import (
        COLLAPSE_GROUPINGS,
        NO_LR,
        SETUP_GROUPINGS,
        evaluate_runs,
    )
    from collapse_guard.predictor.evaluate.baselines import default_baselines
    from collapse_guard.predictor.training.holdout import leave_one_group_out
    from collapse_guard.runfiles.records import find_run_files, load_runs

    console = Console(width=160)
    md: list[str] = []  # the same tables, in Markdown, printed last with --markdown
    model = RiskModel.load(args.model)
    records = load_runs(find_run_files(args.runs))
    unseen, seen = SeenRuns.from_meta(model.meta).partition(r.run_id for r in records)
    by_id = {r.run_id: r for r in records}
    runs = [by_id[i] for i in unseen]
    if not runs:
        raise SystemExit(
            f"all {len(records)} runs under {args.runs} were used to train or validate model "
            f"{model.meta['version']}; pass runs it never saw"
        )
    train, validation = ([by_id[i] for i in seen[k]] for k in ("train", "validation"))
    baselines = default_baselines(
        train or None, validation or None, horizon=model.horizon, budget_per_10k=args.budget
    )
    report = evaluate_runs(
        runs, model, baselines, budget_per_10k=args.budget, horizon=model.horizon
    )
    title = (
        f"model {model.meta['version']} on {len(runs)} runs it never saw ({len(train)} "
        f"training and {len(validation)} validation runs set apart): stored warn level; "
        f"ROC-like = threshold fitted on test runs at {args.budget:g} FA/10k"
    )
    _print_table(console, title, target_rows(report), md)
    targets = (
        f"targets (held-out families, warn level): recall >= {TARGET_RECALL} of collapses "
        f"that develop, median lead >= {TARGET_LEAD:g} steps, <= {TARGET_FA:g} FA/10k; "
        f"recall >= {TARGET_RATIO:g}x the best baseline's at the same FA rate"
    )
    console.print(targets)
    md.append(targets + "\n")
    _print_table(console, "stored levels against their budgets", budget_rows(report), md)

    sources = sorted({r.meta.source for r in runs})
    shown = ["all", *sources] if len(sources) > 1 else ["all"]
    for source in shown:
        _print_table(
            console,
            f"inside LR rises ({source}; the LR rose within the last {model.horizon} steps) "
            "and outside: false alarms per 10k healthy steps and step ROC-AUC on each side "
            f"(targets at warn: <= {TARGET_RISE_FA:g} FA/10k, AUC >= {TARGET_RISE_AUC:g} "
            f"in rises; {NO_LR} where no rows)",
            rise_rows(report, source),
            md,
        )
    groups = report.groups_frame()
    for source in shown:
        for grouping in (*COLLAPSE_GROUPINGS, *SETUP_GROUPINGS):
            present = set(groups.loc[groups["grouping"] == grouping, "group"])
            # set-ups only over all sources, and only where there are several
            if grouping in SETUP_GROUPINGS and (len(present) < 2 or source != "all"):
                continue
            _print_table(
                console,
                f"caught per {grouping} ({source}), recall (median lead), each scorer at its "
                "own point (model: warn)",
                kind_rows(report, grouping, source),
                md,
            )
    per_source = _leads_per_source(runs, model.horizon)
    leads = pd.concat(per_source.values(), ignore_index=True)
    for source in shown:
        for by in ("kind", "cause"):
            _print_table(
                console,
                f"lead per signal group ({source}), by {by}: share of collapses warned >= "
                f"{report.min_lead} steps ahead (median lead)",
                group_rows(report, leads, by, source),
                md,
            )
    # model-free, so every run given counts, those the model trained on included
    every = (
        leads
        if len(runs) == len(records)
        else pd.concat(_leads_per_source(records, model.horizon).values(), ignore_index=True)
    )
    for by in ("optimizer", "model_family", "data"):
        if every[by].nunique() > 1:
            _print_table(
                console,
                f"lead per signal group per {by}, all {len(records)} runs given: share of "
                f"collapses that develop, and of the {by}'s healthy runs, departing >= "
                f"{report.min_lead} steps ahead",
                setup_group_rows(every, by),
                md,
            )
    if args.separability:
        _print_separability(console, records, model, md, _groups(args.add_groups))
    multiples = {
        s: {k: round(v, 1) for k, v in f.attrs["n_std"].items() if v != DEPARTURE_STD}
        for s, f in per_source.items()
    }
    definition = (
        f"departure: beyond mean ± {DEPARTURE_STD:g} std of the run's own steps in "
        f"[onset - H - W, onset - H), H = {model.horizon}, W = {REFERENCE_STEPS}; the multiple "
        f"raised where a source's healthy runs would depart more than {CONTROL_RATE:.0%} of "
        f"the time: {multiples} (so the healthy-control row is in-sample)"
    )
    console.print(definition)
    md.append(definition + "\n")
    for by in ("kind", "cause"):
        for line in missed_lines(report, leads, by):
            console.print(line)
            md.append(f"- {line}")
    if args.gain > 0:
        _print_table(console, f"top {args.gain} features by gain", gain_rows(model, args.gain), md)
    if args.leave_one_out:
        holdout = leave_one_group_out(
            records,
            by=args.leave_one_out,
            synthetic=args.synthetic,
            eval_budget_per_10k=args.budget,
            progress=console.log,
        )
        _print_table(
            console,
            f"leave-one-{args.leave_one_out}-out: recall (median lead) @FA/10k on the held-out "
            f"{args.leave_one_out}, each scorer at its own out-of-sample point (model: warn)",
            holdout_rows(holdout),
            md,
        )
        _print_table(
            console,
            f"leave-one-{args.leave_one_out}-out inside LR rises and outside: each fold's "
            f"model at its stored warn level ({NO_LR} where no rows)",
            holdout_rise_rows(holdout),
            md,
        )
    if args.ablate or args.extra_context or args.add_groups:
        _print_ablation(console, records, args, md)
    if args.markdown:
        print("\n" + "\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
