"""The rescue benchmark's tables (``guard_rescue.py --report-only``), in markdown.

Every table is judged on what can be saved (issue 32): each figure is given for all the
configurations and, after a ``/``, for those whose safe-LR run learns (its best 20-step
loss under its data's bigram entropy: ``saveable``). A configuration whose safe-LR run
does not learn has nothing an arm could save; the second figure leaves those out.

``by`` is ``guard_rescue._by_config``'s: configuration index -> arm -> result row.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence

__all__ = [
    "arm_table",
    "average_table",
    "config_table",
    "fmt",
    "healthy_table",
    "outcome",
    "paired_lines",
    "saveable",
    "sort_key",
]

Rows = list[dict]  # one {arm: row} per configuration


def sort_key(index) -> tuple:
    """Sweep indices (ints) first, then named set-ups (``adamw-III``)."""
    return (isinstance(index, str), index)


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:{spec}}"


def outcome(row: dict | None) -> str:
    if row is None:
        return "..."
    if row.get("gave_up"):
        return "gave up"
    if not row["healthy"]:
        return f"collapsed {row['onset']}"
    return "healthy" if row.get("saved", True) else f"unlearned {row['best_loss']:.2f}"


def saveable(arms: dict) -> bool:
    """The configuration's safe-LR run learns: there is something to save."""
    return "safe_lr" in arms and arms["safe_lr"]["saved"]


def _learns(arms: dict) -> str:
    return "..." if "safe_lr" not in arms else "yes" if saveable(arms) else "no"


def _split(rows: Rows, measure: Callable[..., str], *args: str) -> str:
    """``measure(rows, *args, learnt)`` of all the configurations / of the saveable ones
    (``learnt``: rows of saveable configurations only)."""
    learnt = [a for a in rows if saveable(a)]
    return f"{measure(rows, *args, learnt=False)} / {measure(learnt, *args, learnt=True)}"


def _median(values: Sequence[float], spec: str) -> str:
    values = [x for x in values if math.isfinite(x)]
    return fmt(statistics.median(values), spec) if values else "-"


def _gap_to_safe(rows: Rows, arm: str, *, learnt: bool) -> str:
    """Median final loss minus the safe-LR run's, where both are healthy (``learnt``:
    both saved, the label's rule and the bigram's)."""
    key = "saved" if learnt else "healthy"
    gaps = [
        a[arm]["final_loss"] - a["safe_lr"]["final_loss"]
        for a in rows
        if "safe_lr" in a and a[arm][key] and a["safe_lr"][key]
    ]
    return _median(gaps, "+.3f")


def _steps_lost(rows: Rows, arm: str, *, learnt: bool) -> str:
    steps = [a[arm]["steps_lost"] for a in rows if "steps_lost" in a[arm]]
    return f"{statistics.median(steps):.0f}, {sum(steps)}" if steps else "-"


def _saved(rows: Rows, arm: str, *, learnt: bool) -> str:
    """Saved / configurations (the healthy ones, the label alone, in brackets)."""
    saved, healthy = (sum(a[arm][k] for a in rows) for k in ("saved", "healthy"))
    return f"{saved}/{len(rows)} ({healthy})"


def _count(rows: Rows, *, learnt: bool) -> str:
    return str(len(rows))


def _fewer_steps(rows: Rows, arm: str, other: str, *, learnt: bool) -> str:
    """Configurations where ``arm`` lost fewer - as many - more steps than ``other``."""
    d = [a[arm]["steps_lost"] - a[other]["steps_lost"] for a in rows]
    return f"{sum(x < 0 for x in d)}-{sum(x == 0 for x in d)}-{sum(x > 0 for x in d)}"


def _final_minus(rows: Rows, arm: str, other: str, *, learnt: bool) -> str:
    """Median final loss of ``arm`` minus ``other``'s, where both are saved."""
    both = [a for a in rows if a[arm]["saved"] and a[other]["saved"]]
    return _median([a[arm]["final_loss"] - a[other]["final_loss"] for a in both], "+.3f")


def _moved(rows: Rows, arm: str, *, learnt: bool) -> str:
    """``arm``'s final loss minus the unguarded run's: median (worst)."""
    d = [a[arm]["final_loss"] - a["unguarded"]["final_loss"] for a in rows if arm in a]
    d = [x for x in d if math.isfinite(x)]
    return f"{_median(d, '+.4f')} (worst {fmt(max(d, default=None), '+.4f')})"


def config_table(by: dict, arms: Sequence[str], guard_arms: Sequence[str]) -> None:
    """One row a collapsing configuration: each arm's outcome and final loss, and each
    guard arm's rescues and steps lost."""
    shown = [arm for arm in arms if any(arm in a for a in by.values())]
    guards = [arm for arm in shown if arm in guard_arms]
    head = ["config", "half", "mechanism", "bigram", "safe LR learns", *shown]
    head += [f"final loss: {' / '.join(shown)}"]
    head += [f"rescues, steps lost: {arm}" for arm in guards]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for index in sorted(by, key=sort_key):
        row = by[index]
        first = next(iter(row.values()))
        if first["half"] is None:  # no collapse unguarded (or not run yet): healthy_table
            continue
        cells = [str(index), str(first["half"]), first["group"], fmt(first.get("bigram"), ".2f")]
        cells.append(_learns(row))
        cells += [outcome(row.get(arm)) for arm in shown]
        cells.append(
            " / ".join(fmt(row[arm]["final_loss"]) if arm in row else "-" for arm in shown)
        )
        cells += [
            f"{row[arm]['rescues']}, {row[arm]['steps_lost']}" if arm in row else "-"
            for arm in guards
        ]
        print("| " + " | ".join(cells) + " |")


def arm_table(by: dict, arms: Sequence[str], halves: Sequence[str]) -> None:
    """Per arm and half: saved, final loss against the safe-LR run, steps lost; each
    for all configurations / the saveable ones."""
    halves = [h for h in halves if any(next(iter(a.values()))["half"] == h for a in by.values())]
    head = ["arm"] + [f"saved (healthy), {h}: all / saveable" for h in halves]
    head += [f"final - safe LR, {h} (median): all / saveable" for h in halves]
    head += [f"steps lost, {h} (median, total): all / saveable" for h in halves]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for arm in arms:
        rows = {h: [a for a in by.values() if arm in a and a[arm]["half"] == h] for h in halves}
        if not any(rows.values()):
            continue
        cells = [arm]
        for measure in (_saved, _gap_to_safe, _steps_lost):
            cells += [_split(rows[h], measure, arm) for h in halves]
        print("| " + " | ".join(cells) + " |")
    print(
        "\nfinal - safe LR: where both runs are healthy (all) / both saved (saveable: "
        "the safe-LR run learns)"
    )


def paired_lines(by: dict, pairs: Sequence[tuple[str, str]]) -> None:
    """Arm against arm on the collapsing configurations both ran: fewer, as many, more
    steps lost, and the median final-loss difference where both are saved."""
    for arm, other in pairs:
        rows = [a for a in by.values() if arm in a and other in a and a[arm]["half"]]
        if rows:
            print(
                f"{arm} vs {other} ({len(rows)} configurations; all / saveable): steps lost "
                f"fewer-same-more {_split(rows, _fewer_steps, arm, other)}; final loss "
                f"{arm} - {other} (median, both saved) {_split(rows, _final_minus, arm, other)}"
            )


def healthy_table(by: dict, guard_arms: Sequence[str]) -> None:
    """Where the unguarded run does not collapse: each guard arm's final loss against the
    unguarded run's (the guard must not make a healthy run worse)."""
    quiet = {i: a for i, a in by.items() if "unguarded" in a and a["unguarded"]["onset"] is None}
    shown = [arm for arm in guard_arms if any(arm in a for a in quiet.values())]
    if not quiet or not shown:
        return
    head = ["config", "recipe", "bigram", "safe LR learns", "unguarded"]
    head += [f"{arm} - unguarded" for arm in shown] + ["heads clipped, largest logit: guarded"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for index in sorted(quiet, key=sort_key):
        row, u = quiet[index], quiet[index]["unguarded"]
        cells = [str(index), u["recipe"], fmt(u["bigram"], ".2f"), _learns(row)]
        cells.append(fmt(u["final_loss"]))
        cells += [
            fmt(row[arm]["final_loss"] - u["final_loss"], "+.4f") if arm in row else "-"
            for arm in shown
        ]
        g = row.get("guarded", {})
        cells.append(f"{g.get('qk_clips', '-')}, {fmt(g.get('logit_max'), '.1f')}")
        print("| " + " | ".join(cells) + " |")
    for arm in shown:
        moved = _split(list(quiet.values()), _moved, arm)
        print(f"\n{arm} - unguarded where the unguarded run does not collapse: {moved}")


def average_table(by: dict) -> None:
    """Rollback to the basin's mean (``guarded``) against the newest checkpoint alone
    (``newest``), per collapse kind: configurations with both arms only."""
    both = [a for a in by.values() if "guarded" in a and "newest" in a]
    if not both:
        return
    head = ["half", "mechanism", "configs: all / saveable"]
    head += [f"{what}, mean / newest: all / saveable" for what in ("saved", "final - safe LR")]
    head += ["steps lost (median, total), mean / newest: all / saveable"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    groups = defaultdict(list)
    for arms in both:
        groups[arms["guarded"]["half"], arms["guarded"]["group"]].append(arms)
    for (half, group), rows in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        cells = [str(half), group, _split(rows, _count)]
        for measure in (_saved, _gap_to_safe, _steps_lost):
            cells.append(" ; ".join(_split(rows, measure, arm) for arm in ("guarded", "newest")))
        print("| " + " | ".join(cells) + " |")
