"""Rich tables of an evaluation, as the commands and the bundle print them.

``print_report``: every scorer at its out-of-sample point, then at a threshold fitted on
the evaluated runs (ROC-like, secondary), then inside LR rises and outside, per source, and
whether the stored levels hold their budgets; ``print_groups``: per collapse kind, cause,
onset and set-up; ``holdout_table``: a leave-one-group-out evaluation, and
``holdout_rise_table`` its model inside LR rises and outside. rich is imported when a table is
built, so that importing this module stays light.
"""

from __future__ import annotations

__all__ = [
    "holdout_groups_table",
    "holdout_rise_table",
    "holdout_table",
    "print_groups",
    "print_report",
]


def _fmt(value, digits: int = 3) -> str:
    return "—" if value is None or value != value else f"{value:.{digits}g}"


def _rate(value) -> str:
    # a false-alarm rate: whole numbers past 10 (211, not 2.1e+02), two digits below
    if value is None or value != value:
        return "—"
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


# where each threshold came from, in a table's words (evaluate.report)
_FITTED_ON = {"validation": "val", "rule": "rule", "test": "test*"}
_FITTED_NOTE = (
    "rec = recall, hit = caught / collapses, lead = median steps ahead, FA = false alarms "
    "per 10k healthy steps, AP = average precision. set on: val = validation runs (stored "
    "level, tuned baseline), rule = the original's own rule; test* = threshold fitted on "
    "these test runs for the same false-alarm rate (ROC-like, secondary)"
)


def _scorer_table(report, title: str, source: str = "all"):
    """Rich table: each scorer at its out-of-sample point (the model at its stored levels,
    a rule as it fires, a tuned baseline at its validation threshold), then every scorer at
    a threshold fitted on these test runs for the same false-alarm rate (ROC-like).

    ``lead`` is the median lead time of caught collapses, in steps.
    """
    from rich import box
    from rich.table import Table

    from collapse_guard.predictor.core.levels import WARN
    from collapse_guard.predictor.evaluate.scorer import LEVEL_POINT, level_point

    # SIMPLE_HEAD and short headers: the table must fit 80 columns (rich's width off a tty)
    table = Table(title=title, caption=_FITTED_NOTE, box=box.SIMPLE_HEAD, pad_edge=False)
    headers = ("scorer", "point", "set on", "rec", "hit", "lead", "FA")
    for column in (*headers, "AP", "Brier"):
        text = column in ("scorer", "point", "set on")
        table.add_column(column, justify="left" if text else "right", no_wrap=text)
    frame = report.to_frame()
    frame = frame[frame["source"] == source]
    stored = frame[frame["fitted_on"] != "test"]
    fitted = frame[frame["fitted_on"] == "test"]
    for part in (stored, fitted):
        for r in part.itertuples():
            headline = r.scorer == "model" and r.operating_point == level_point(WARN)
            table.add_row(
                r.scorer,
                r.operating_point.removeprefix(LEVEL_POINT),
                _FITTED_ON[r.fitted_on],
                _fmt(r.recall, 2),
                f"{r.caught}/{r.n_collapsed}",
                _fmt(r.median_lead),
                _fmt(r.fa_per_10k),
                _fmt(r.pr_auc, 2),
                _fmt(r.brier, 2),
                style="bold" if headline else None,
                end_section=part is stored and r.Index == stored.index[-1],
            )
    return table


_RISE_NOTE = (
    "in = steps whose LR rose within the last {h} steps (features.rises), out = the "
    "others, over the runs that record an LR; FA = false alarms per 10k healthy steps "
    "there, AUC = step ROC-AUC over their pre-onset rows"
)


def _rise_cells(row) -> tuple[str, ...]:
    """FA in, FA out, AUC in, AUC out of one row of a rise frame."""
    return (
        _fmt(row["inside_fa_per_10k"]),
        _fmt(row["outside_fa_per_10k"]),
        _fmt(row["inside_roc_auc"], 2),
        _fmt(row["outside_roc_auc"], 2),
    )


def _rise_title(title: str, frame) -> str:
    """The title with the runs and healthy steps counted on each side."""
    first = frame.iloc[0]
    return (
        f"{title}: {int(first['runs_with_lr'])} of {int(first['n_runs'])} runs record an LR; "
        f"healthy steps {int(first['inside_healthy_steps'])} in rises, "
        f"{int(first['outside_healthy_steps'])} out"
    )


def _rise_table(report, title: str, source: str = "all"):
    """Rich table: each scorer at its out-of-sample points (the model at each stored level)
    inside LR rises and outside; a line instead where no run records an LR."""
    from rich import box
    from rich.table import Table

    from collapse_guard.predictor.evaluate.rises import NO_LR
    from collapse_guard.predictor.evaluate.scorer import LEVEL_POINT

    frame = report.rise_frame(source)
    if frame.empty or not frame["runs_with_lr"].any():
        return f"{title}: {NO_LR} in these runs, so no rows inside LR rises"
    note = _RISE_NOTE.format(h=report.horizon)
    table = Table(
        title=_rise_title(title, frame), caption=note, box=box.SIMPLE_HEAD, pad_edge=False
    )
    for column in ("scorer", "point", "FA in", "FA out", "AUC in", "AUC out"):
        text = column in ("scorer", "point")
        table.add_column(column, justify="left" if text else "right", no_wrap=text)
    for _, row in frame.iterrows():
        point = row["operating_point"].removeprefix(LEVEL_POINT)
        table.add_row(row["scorer"], point, *_rise_cells(row))
    return table


def holdout_rise_table(holdout, title: str):
    """Rich table: the model of each fold of a leave-one-group-out at its stored warn
    level, inside LR rises and outside, one row per held-out group and the mean; a line
    instead where no run records an LR."""
    from rich import box
    from rich.table import Table

    from collapse_guard.predictor.evaluate.rises import NO_LR, fold_rise_frame

    frame = fold_rise_frame(holdout.folds)
    if frame.empty or not frame["runs_with_lr"].any():
        return f"{title}: {NO_LR} in the held-out runs, so no rows inside LR rises"
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column(holdout.grouping, no_wrap=True)
    for column in ("runs", "steps in", "steps out", "FA in", "FA out", "AUC in", "AUC out"):
        table.add_column(column, justify="right")
    for _, row in frame.iterrows():
        counts = (row["runs_with_lr"], row["inside_healthy_steps"], row["outside_healthy_steps"])
        table.add_row(str(row["group"]), *(str(int(c)) for c in counts), *_rise_cells(row))
    return table


def _budget_table(report, title: str):
    """Rich table: do the stored levels hold their false-alarm budgets, per source?"""
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("source", "level", "budget/10k", "FA/10k", "false alarms", "within 2x"):
        table.add_column(column, justify="left" if column in ("source", "level") else "right")
    for c in report.budget_checks:
        holds = {True: "yes", False: "[red]no[/]", None: "too few steps"}[c.holds]
        table.add_row(
            c.source,
            c.level,
            _fmt(c.budget_per_10k),
            _fmt(c.fa_per_10k),
            f"{c.false_alarms} in {c.healthy_steps} steps",
            holds,
        )
    return table


def print_report(console, report, heading: str) -> None:
    """Print the scorer table for all sources pooled, then per source when there are
    several, then whether the stored levels hold their budgets."""
    sources = sorted(set(report.to_frame()["source"]) - {"all"})
    budget = f"test* at {report.budget_per_10k:g} FA/10k"
    console.print(_scorer_table(report, f"{heading}: all sources ({budget})"))
    console.print(_rise_table(report, f"{heading}, inside LR rises: all sources"))
    if len(sources) > 1:
        for source in sources:
            console.print(_scorer_table(report, f"{heading}: {source}", source=source))
            console.print(_rise_table(report, f"{heading}, inside LR rises: {source}", source))
    if report.budget_checks:
        factor = "stored levels within 2x of their budgets?"
        console.print(_budget_table(report, f"{heading}: {factor}"))


def _group_table(report, grouping: str, title: str):
    """Rich table: per group, the model's recall and lead at its stored warn level beside
    the best baseline at its own point (``grouping``: kind, cause, onset, family, ...)."""
    from rich import box
    from rich.table import Table

    wide = report.group_table(grouping)
    baselines = [
        c.removesuffix(" recall")
        for c in wide.columns
        if c.endswith(" recall") and c != "model recall"
    ]
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for column in (grouping, "n", "recall", "lead", "best baseline"):
        table.add_column(
            column, justify="left" if column in (grouping, "best baseline") else "right"
        )
    for group, row in wide.iterrows():
        recalls = {
            b: row[f"{b} recall"] for b in baselines if row[f"{b} recall"] == row[f"{b} recall"]
        }
        best = max(recalls, key=recalls.get, default=None)
        table.add_row(
            str(group),
            str(row["n"]),
            _fmt(row.get("model recall")),
            _fmt(row.get("model lead")),
            "—" if best is None or not recalls[best] else f"{best} {_fmt(recalls[best])}",
        )
    return table


def print_groups(console, report) -> None:
    """Per collapse kind, cause and onset (sudden / develops), and per model family,
    optimizer and data where the runs hold more than one."""
    from collapse_guard.predictor.evaluate import COLLAPSE_GROUPINGS, SETUP_GROUPINGS

    if "model" not in report.scorers:
        return
    frame = report.groups_frame()
    for grouping in (*COLLAPSE_GROUPINGS, *SETUP_GROUPINGS):
        present = set(frame.loc[frame["grouping"] == grouping, "group"])
        if grouping in SETUP_GROUPINGS and len(present) < 2:
            continue
        title = f"per {grouping}: model at warn, baselines at their own points"
        console.print(_group_table(report, grouping, title))


def holdout_table(holdout, title: str, operating_point: str = "headline"):
    """Rich table: one row per scorer, one column per held-out group and the mean; each
    cell 'recall (median lead) @false alarms per 10k healthy steps', at each scorer's own
    point (``headline``) or at the ROC-like one (``budget``)."""
    from rich import box
    from rich.table import Table

    recall, lead, fa = (
        holdout.wide(figure, operating_point) for figure in ("recall", "median_lead", "fa_per_10k")
    )
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("scorer", no_wrap=True)
    for group in recall.index:
        table.add_column(str(group), justify="right", no_wrap=True)
    for scorer in recall.columns:
        cells = []
        for group in recall.index:
            r, lead_, fa_ = (f.loc[group, scorer] for f in (recall, lead, fa))
            cells.append("—" if r != r else f"{r:.2f} ({_fmt(lead_)}) @{_rate(fa_)}")
        table.add_row(scorer, *cells, style="bold" if scorer == "model" else None)
    return table


def holdout_groups_table(holdout, grouping: str, title: str):
    """Rich table: the model at its stored warn level, one row per group of ``grouping``
    (onset, cause, optimizer, ...), one column per held-out group and ``all``; each cell
    'recall (caught/collapses)', and for a set-up grouping '@false alarms per 10k healthy
    steps' of its runs. Says which collapses a new set-up's model misses, and on which
    set-ups it spends its false alarms."""
    from rich import box
    from rich.table import Table

    counts = holdout.group_counts(grouping)
    columns = list(dict.fromkeys(counts.columns.get_level_values(0)))
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column(grouping, no_wrap=True)
    for column in columns:
        table.add_column(str(column), justify="right", no_wrap=True)
    for group, row in counts.iterrows():
        cells = []
        for column in columns:
            caught, n = row[(column, "caught")], row[(column, "n")]
            cell = f"{caught / n:.2f} ({caught}/{n})" if n else "—"
            steps = row.get((column, "healthy_steps"), 0)
            if steps:
                cell += f" @{_rate(1e4 * row[(column, 'false_alarms')] / steps)}"
            cells.append(cell)
        table.add_row(str(group), *cells)
    return table
