"""Issue 20: do two sweeps collapse the same way? Their timing and per-signal leads, side by side.

    OMP_WAIT_POLICY=passive .venv/bin/python benchmarks/recipe_leads.py \\
        --runs sampler=/root/cg-data/issue20/sampler-adamw \\
        --runs nanogpt=/root/cg-data/issue20/nanogpt [--model SOURCE] [--markdown]

Each set is read against its own healthy runs (``group_leads.group_leads``: a signal's
multiple of std is raised until at most 5 % of that set's healthy runs depart in their
last H steps), so a signal group that departs early on one set and not on the other
says the runs collapse differently, not that one set was calibrated better. Only
finished run files are read: safe beside a sweep that is still writing.

Printed per set: outcomes (healthy; develops 50+ steps after its trigger; 10-49;
sudden), when the collapses begin (onset step, its share of the run, steps after the
latest trigger, the LR at onset over the highest LR before it), their causes and label
kinds; then per signal group, over the collapses that develop (10+ steps after their
trigger), the share that departed at least MIN_LEAD steps ahead (median lead) and the
signal that departed first most often, beside the share of the set's healthy runs that
departed in their last H steps. With ``--model`` (``bundled``: the shipped model), the
model's held risk per set: its highest on healthy runs, its highest in the H steps
before each collapse, and how many collapses pass the set's own healthy maximum (and
the stored ``warn``) at least MIN_LEAD steps before onset, and how early.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections import Counter
from pathlib import Path

# before lightgbm or torch is imported: spinning OpenMP threads make a busy machine crawl
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from predictor_eval import markdown_table
from real_runs import OUTCOMES, outcome

__all__ = ["lead_rows", "main", "risk_rows", "timing_rows"]


def _set(spec: str) -> tuple[str, Path]:
    label, sep, folder = spec.partition("=")
    if not sep or not label or not folder:
        raise argparse.ArgumentTypeError(f"expected LABEL=DIR (e.g. nanogpt=runs/x), got {spec!r}")
    return label, Path(folder)


def _quartiles(values: list[float], fmt: str = "{:.0f}") -> str:
    if len(values) < 2:
        return ", ".join(fmt.format(v) for v in values) or "—"
    return " / ".join(fmt.format(q) for q in statistics.quantiles(values, n=4))


def timing_rows(sets: dict[str, list]) -> list[dict]:
    """One row per measure, one column per set: outcomes, then when and how runs collapse."""
    columns: dict[str, dict[str, str]] = {}
    for label, records in sets.items():
        metas = [r.meta for r in records]
        outcomes = Counter(outcome(m) for m in metas)
        collapsed = [r for r in records if r.meta.onset_step is not None]
        at_onset = []  # LR at onset over the highest LR before it
        for r in collapsed:
            before = r.frame.loc[r.frame["step"] <= r.meta.onset_step, "lr"]
            at_onset.append(float(before.iloc[-1] / before.max()))
        column = {"runs": str(len(metas))}
        column.update({o: str(outcomes[o]) for o in OUTCOMES})
        column["onset step (quartiles)"] = _quartiles([r.meta.onset_step for r in collapsed])
        column["onset / run length"] = _quartiles(
            [r.meta.onset_step / r.meta.extra["steps_run"] for r in collapsed], "{:.2f}"
        )
        column["steps after trigger"] = _quartiles(
            [r.meta.extra["trigger_to_onset"] for r in collapsed]
        )
        column["LR at onset / peak before"] = _quartiles(at_onset, "{:.2f}")
        causes = Counter(r.meta.extra.get("collapse_cause") for r in collapsed)
        column["causes"] = ", ".join(f"{c} {n}" for c, n in causes.most_common())
        kinds = Counter(r.meta.extra.get("collapse_kind") for r in collapsed)
        column["label kinds"] = ", ".join(f"{k} {n}" for k, n in kinds.most_common())
        columns[label] = column
    measures = list(next(iter(columns.values())))
    return [{"measure": m, **{label: columns[label][m] for label in columns}} for m in measures]


def lead_rows(sets: dict[str, list]) -> list[dict]:
    """One row per signal group: per set, 'share (median lead) top signal' over its
    collapses that develop, and the share of its healthy runs that departed."""
    from group_leads import HEALTHY_CONTROL, group_lead_table, group_leads

    tables = {}
    for label, records in sets.items():
        leads = group_leads(records)
        keep = leads["control"] | (leads["onset"] == "develops")
        leads = leads[keep].assign(
            group=lambda f: f["control"].map({True: HEALTHY_CONTROL, False: "develops"})
        )
        by = ["group", "signal_group"]
        tables[label] = group_lead_table(leads, by="group").set_index(by)
    signal_groups = list(dict.fromkeys(f for t in tables.values() for _, f in t.index))
    rows = []
    for signal_group in signal_groups:
        row = {"signals": signal_group}
        for label, table in tables.items():
            row[f"{label} develops"] = _cell(table, "develops", signal_group, top=True)
            row[f"{label} healthy"] = _cell(table, HEALTHY_CONTROL, signal_group, top=False)
        rows.append(row)
    counts = {"signals": "runs (with a range)"}
    for label, table in tables.items():
        for group, name in (("develops", "develops"), (HEALTHY_CONTROL, "healthy")):
            n = table.xs(group, level="group")["n"].max() if group in table.index else 0
            counts[f"{label} {name}"] = str(int(n))
    return [*rows, counts]


def risk_rows(sets: dict[str, list], model) -> list[dict]:
    """One row per measure, one column per set: where the model's held risk goes."""
    from collapse_guard.predictor.evaluate import MIN_LEAD

    warn = model.thresholds["warn"]
    columns = {}
    for label, records in sets.items():
        healthy, before = [], []  # highest risk of each healthy run; (onset, risk) of collapses
        for r in records:
            risk = model.predict_run(r.frame, steps=r.frame["step"])
            if r.meta.onset_step is None:
                healthy.append(float(risk.max()))
            else:
                before.append((r.meta.onset_step, risk[risk.index < r.meta.onset_step]))
        ceiling = max(healthy, default=float("nan"))
        window = [float(p[p.index >= onset - model.horizon].max()) for onset, p in before]
        column = {
            "healthy runs: highest risk (quartiles)": _quartiles(healthy, "{:.2f}"),
            f"collapses: highest risk in the {model.horizon} steps before": _quartiles(
                window, "{:.2f}"
            ),
        }
        for name, level in (("healthy maximum", ceiling), (f"warn {warn:.2f}", warn)):
            leads = [_first_lead(onset, p, level) for onset, p in before]
            early = [lead for lead in leads if lead >= MIN_LEAD]
            column[f"collapses past the {name} >= {MIN_LEAD} ahead"] = (
                f"{len(early)}/{len(before)}" + (f", lead {_quartiles(early)}" if early else "")
            )
        columns[label] = column
    measures = list(next(iter(columns.values())))
    return [{"measure": m, **{label: columns[label][m] for label in columns}} for m in measures]


def _first_lead(onset: int, risk, level: float) -> float:
    """Steps before onset at which the risk first exceeded ``level`` (0: never)."""
    above = risk.index[risk.to_numpy() > level]
    return float(onset - above[0]) if len(above) else 0.0


def _cell(table, group: str, signal_group: str, *, top: bool) -> str:
    if (group, signal_group) not in table.index or not table.loc[(group, signal_group), "n"]:
        return "—"
    row = table.loc[(group, signal_group)]
    text = f"{row['share']:.2f}"
    if top and row["warned"]:
        text += f" ({row['median_lead']:.0f}) {row['top_signal']}"
    return text


def _print(title: str, rows: list[dict], md: list[str]) -> None:
    print(f"\n{title}")
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in rows[0]}
    print("  ".join(f"{k:<{w}}" for k, w in widths.items()))
    for row in rows:
        print("  ".join(f"{row[k]!s:<{w}}" for k, w in widths.items()))
    md.append(markdown_table(title, rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=_set, action="append", required=True, metavar="LABEL=DIR")
    parser.add_argument("--model", default=None, help="also the model's risk (bundled: shipped)")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    args = parser.parse_args(argv)

    from collapse_guard.predictor.evaluate import MIN_LEAD
    from collapse_guard.runfiles.records import find_run_files, load_runs

    sets = {label: load_runs(find_run_files([folder])) for label, folder in args.runs}
    md: list[str] = []
    _print("when and how the runs collapse (quartiles: 25 / 50 / 75 %)", timing_rows(sets), md)
    _print(
        f"per signal group, collapses that develop: share departed >= {MIN_LEAD} steps "
        "ahead (median lead) first signal; healthy: share departed in the last H steps",
        lead_rows(sets),
        md,
    )
    if args.model is not None:
        from collapse_guard.predictor.core.risk import RiskModel

        model = RiskModel.load(None if args.model == "bundled" else args.model)
        _print(
            f"model {model.meta['version']}, held risk (stored warn "
            f"{model.thresholds['warn']:.3f})",
            risk_rows(sets, model),
            md,
        )
    if args.markdown:
        print("\n" + "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
