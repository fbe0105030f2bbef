"""Lead time per signal group: a model-free account of "why" a kind is missed.

For each collapse and each signal group, the earliest step in the H steps before
onset at which any signal of the group left the run's own healthy range, where that
range is mean +- 4 std of the signal over the W steps before those H,
[onset - H - W, onset - H) (a sparse signal, e.g. attention every 50 steps, reaches
back to its last 5 measurements), the 4 raised per signal until at most 5% of healthy
runs "depart" in their last H steps (so a signal that drifts by itself does not warn on
every run). The same rule on the last H steps of healthy runs (the ``healthy-control``
rows) says how often a signal group departs with no collapse coming.

A signal group is a group of *signals* (``collapse_guard.signals``: gradient,
attention, ...); a model family is the ``model_family`` column (``groups.setup_of``).

Per set-up (:func:`setup_lead_table`, e.g. per optimizer), each set-up's collapses are
read against that set-up's own healthy runs: a signal group that departs before AdamW
collapses says nothing if it departs as often on healthy AdamW runs.

Inside LR rises (issue 34): each departure says whether it came at a step in an LR rise
(``features.rises``: the LR rose within the last H steps), and :func:`group_lead_table`
the share of warned runs whose departure did; on the healthy-control rows that is where a
signal group's false departures live. :func:`signal_group_ablation` is the model's side:
a leave-one-group-out with every signal, then without each signal group, each read inside
LR rises and outside.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from collapse_guard.features import DEFAULT_WINDOW
from collapse_guard.features.rises import frame_in_lr_rise
from collapse_guard.predictor.evaluate.events import MIN_LEAD
from collapse_guard.predictor.evaluate.groups import (
    SETUP_GROUPINGS,
    cause_of,
    kind_of,
    run_groups,
)
from collapse_guard.runfiles.label import HORIZON
from collapse_guard.signals import SIGNALS

__all__ = [
    "CONTROL_RATE",
    "DEPARTURE_STD",
    "HEALTHY_CONTROL",
    "MIN_CONTROLS",
    "MIN_REFERENCE_POINTS",
    "REFERENCE_STEPS",
    "SIGNAL_GROUPS",
    "group_lead_table",
    "group_leads",
    "setup_lead_table",
    "signal_group_ablation",
    "signal_groups",
]

REFERENCE_STEPS = DEFAULT_WINDOW  # W: the healthy range is taken over one feature window
DEPARTURE_STD = 4.0  # a signal departs when beyond mean +- (at least) this many std
CONTROL_RATE = 0.05  # most healthy runs a signal may "depart" on (sets its multiple)
MIN_REFERENCE_POINTS = 5  # measurements a signal needs to define its healthy range
MIN_CONTROLS = 10  # healthy runs a signal needs before its multiple is calibrated
HEALTHY_CONTROL = "healthy-control"  # the kind given to healthy runs' (control) rows
# the run's groupings beside its kind and cause; "family" is the model family, named so
# that no column says "family" alone
_GROUP_COLUMNS = {"onset": "onset", **{g: g for g in SETUP_GROUPINGS}, "family": "model_family"}
_SETUP_COLUMNS = tuple(_GROUP_COLUMNS[g] for g in SETUP_GROUPINGS)  # setup_lead_table's by


def signal_groups() -> dict[str, str]:
    """Signal name -> signal group, from collapse_guard.signals.SIGNALS.

    ``lr`` is taken out of ``output`` into a group of its own, ``config``: it is a
    setting the loop hands the probe, not a measurement of the model (the config-only
    baseline covers it), and a schedule moves it without any instability.
    """
    groups = {s.name: s.group for s in SIGNALS}
    groups["lr"] = "config"
    return groups


SIGNAL_GROUPS: tuple[str, ...] = tuple(dict.fromkeys(signal_groups().values()))


def _departures(
    steps: np.ndarray,
    values: np.ndarray,
    onset: int,
    horizon: int,
    reference: int,
    min_points: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps in [onset - H, onset), |value - mean| / std there), or None without a range."""
    early = onset - horizon
    finite = np.isfinite(values)
    before = finite & (steps < early)
    ref = before & (steps >= early - reference)
    if ref.sum() < min_points:  # a sparse signal: its last min_points measurements
        ref = np.zeros_like(before)
        ref[np.flatnonzero(before)[-min_points:]] = True
    if ref.sum() < min_points:
        return None
    mean = values[ref].mean()
    # a constant range (a count at 0, a flag): any other value departs
    std = max(values[ref].std(), 1e-9 * max(1.0, abs(mean)))
    window = (steps >= early) & (steps < onset)
    # NaN (not measured) never departs; +-inf (a measured blow-up) always does
    return steps[window], np.nan_to_num(np.abs(values[window] - mean) / std, nan=0.0)


def _first_departure(onset: int, steps: np.ndarray, z: np.ndarray, k: float) -> float:
    over = z > k
    return float(onset - steps[np.argmax(over)]) if over.any() else math.nan


def _departed_in_rise(steps: np.ndarray, rise: np.ndarray | None, step: float) -> bool | None:
    """Whether the logged ``step`` lies in an LR rise; None without an LR or a departure."""
    if rise is None or math.isnan(step):
        return None
    return bool(rise[np.searchsorted(steps, step)])


def group_leads(
    runs: Iterable,
    *,
    horizon: int = HORIZON,
    reference: int = REFERENCE_STEPS,
    n_std: float = DEPARTURE_STD,
    control_rate: float | None = CONTROL_RATE,
    min_points: int = MIN_REFERENCE_POINTS,
    signal_group_of: Mapping[str, str] | None = None,
    controls: bool = True,
) -> pd.DataFrame:
    """How early each signal group departed from its healthy range before each collapse.

    ``runs``: ``RunRecord``s (``frame`` with ``step`` and signal columns, ``meta``). For
    each collapsing run and each signal group (``signal_group_of``: signal -> group, default
    :func:`signal_groups`) the *group lead* is onset minus the first step in
    [onset - H, onset) at which any signal of the group lies beyond mean +- k std of
    its own values over the ``reference`` steps before that, [onset - H - W, onset - H).
    A signal with fewer than ``min_points`` finite values there uses its last
    ``min_points`` measurements before onset - H instead, and one with fewer is left
    out. NaN is "not measured" and never departs; a measured +-inf always does.

    The multiple k is ``n_std`` (4), raised per signal where needed so that at most
    ``control_rate`` of healthy runs depart in their last H steps (the same rule with a
    pseudo-onset just after the last step): a signal that drifts by itself (the
    parameter norm grows all through training) would otherwise "warn" on every run.
    ``control_rate=None``, or fewer than MIN_CONTROLS healthy runs measuring a signal,
    keeps k = ``n_std``. The multiples used are in ``.attrs["n_std"]``.

    With ``controls``, the healthy runs' rows are returned too, with kind and cause
    ``healthy-control`` (HEALTHY_CONTROL): the false-departure rate to read the
    collapses' figures against. Where the multiples were calibrated it is in-sample
    (at most ``control_rate`` per signal by construction; a group of several signals
    can exceed it), so read a group's share on a kind against it, not as a test.

    Returns one row per (run, signal group): ``run_id, source, kind, cause, onset_step,
    control``, the run's groupings ``onset`` (None for a control), ``model_family``,
    ``optimizer`` and ``data`` (``groups.run_groups``), then ``signal_group, n_signals``
    (signals of the group with a healthy range; 0 means the group was not measured),
    ``lead`` (steps; NaN when nothing departed), ``first_signal`` (the signal that
    departed first) and ``in_rise`` (whether that departure came in an LR rise of H
    steps; None when nothing departed or the run records no LR).
    """
    group_of = dict(signal_group_of) if signal_group_of is not None else signal_groups()
    order = list(dict.fromkeys(group_of.values()))
    measured = []  # (meta, onset, control, {signal: (steps, z)}, steps, in LR rise)
    for run in runs:
        meta, frame = run.meta, run.frame.sort_values("step")
        steps = frame["step"].to_numpy()
        if not steps.size:
            continue
        control = meta.onset_step is None
        onset = int(steps[-1]) + 1 if control else int(meta.onset_step)
        found = {}
        for name in frame.columns:
            if name in group_of:
                values = frame[name].to_numpy(dtype=np.float64, na_value=np.nan)
                dep = _departures(steps, values, onset, horizon, reference, min_points)
                if dep is not None:
                    found[name] = dep
        if control and not found:
            continue  # too short for any healthy range: no control
        measured.append((meta, onset, control, found, steps, frame_in_lr_rise(frame, horizon)))

    multiples = {}
    for name in group_of:
        peaks = [
            found[name][1].max(initial=0.0)
            for _, _, c, found, *_ in measured
            if c and name in found
        ]
        k = n_std
        if control_rate is not None and len(peaks) >= MIN_CONTROLS:
            k = max(n_std, float(np.quantile(peaks, 1 - control_rate, method="higher")))
        multiples[name] = k

    rows = []
    for meta, onset, control, found, steps, rise in measured:
        if control and not controls:
            continue
        if control:
            kind = cause = HEALTHY_CONTROL
        else:
            kind, cause = kind_of(meta), cause_of(meta)
        groups = run_groups(meta)
        grouped = {column: groups[g] for g, column in _GROUP_COLUMNS.items()}
        for signal_group in order:
            leads = [
                (_first_departure(onset, st, z, multiples[name]), name)
                for name, (st, z) in found.items()
                if group_of[name] == signal_group
            ]
            departed = [(lead, name) for lead, name in leads if not math.isnan(lead)]
            lead, first = max(departed) if departed else (math.nan, None)
            rows.append(
                {
                    "run_id": meta.run_id,
                    "source": meta.source,
                    "kind": kind,
                    "cause": cause,
                    "onset_step": onset,
                    "control": control,
                    **grouped,
                    "signal_group": signal_group,
                    "n_signals": len(leads),
                    "lead": lead,
                    "first_signal": first,
                    "in_rise": _departed_in_rise(steps, rise, onset - lead),
                }
            )
    columns = [
        *("run_id", "source", "kind", "cause", "onset_step", "control"),
        *_GROUP_COLUMNS.values(),
        "signal_group",
    ]
    out = pd.DataFrame(rows, columns=[*columns, "n_signals", "lead", "first_signal", "in_rise"])
    out.attrs["n_std"] = multiples
    return out


def group_lead_table(
    leads: pd.DataFrame, *, by: str = "kind", min_lead: int = MIN_LEAD
) -> pd.DataFrame:
    """Summary of :func:`group_leads` per kind (``by``: ``kind`` or ``cause``) x signal group.

    Columns: ``n`` (runs of the kind where the group was measured), ``warned`` (of
    those, runs where it departed at least ``min_lead`` steps before onset), ``share``
    (warned / n), ``median_lead`` (over the warned runs), ``top_signal`` (the signal
    that most often departed first among them) and ``in_rise`` (the share of the warned
    runs that record an LR whose departure came in an LR rise; NaN: none records one).
    The healthy control rows come last.
    """
    out = []
    for (kind, signal_group), group in leads.groupby([by, "signal_group"], sort=False):
        measured = group[group["n_signals"] > 0]
        warned = measured[measured["lead"] >= min_lead]
        top = Counter(warned["first_signal"]).most_common(1)
        rise = warned["in_rise"].dropna().astype(bool)
        out.append(
            {
                by: kind,
                "signal_group": signal_group,
                "n": len(measured),
                "warned": len(warned),
                "share": len(warned) / len(measured) if len(measured) else math.nan,
                "median_lead": float(warned["lead"].median()) if len(warned) else math.nan,
                "top_signal": top[0][0] if top else None,
                "in_rise": float(rise.mean()) if len(rise) else math.nan,
            }
        )
    columns = [by, "signal_group", "n", "warned", "share", "median_lead", "top_signal"]
    table = pd.DataFrame(out, columns=[*columns, "in_rise"])
    group_order = {f: i for i, f in enumerate(dict.fromkeys(leads["signal_group"]))}
    table["_control"] = table[by] == HEALTHY_CONTROL
    table["_group"] = table["signal_group"].map(group_order)
    table = table.sort_values(["_control", by, "_group"], kind="stable")
    return table.drop(columns=["_control", "_group"]).reset_index(drop=True)


def setup_lead_table(
    leads: pd.DataFrame,
    *,
    by: str = "optimizer",
    onset: str | None = "develops",
    min_lead: int = MIN_LEAD,
) -> pd.DataFrame:
    """Per set-up group, its collapses against its own healthy runs (module docstring).

    ``leads``: :func:`group_leads` with its control rows. ``by``: ``optimizer``,
    ``data`` or ``model_family``. ``onset``: only collapses of this onset kind
    (``develops``: those a forecast can precede; None: all).

    One row per (group, ``control``), collapses first: ``runs`` (with a healthy range
    of any signal), then per signal group the share of those runs where it departed at
    least ``min_lead`` steps before onset (a control: before its end). NaN where no run
    of the row measured the group.
    """
    if by not in _SETUP_COLUMNS:
        raise ValueError(f"by must be one of {sorted(_SETUP_COLUMNS)}; got {by!r}")
    rows = leads[leads["n_signals"] > 0]
    if onset is not None:
        rows = rows[rows["control"] | (rows["onset"] == onset)]
    rows = rows.assign(warned=rows["lead"] >= min_lead)
    keys = [by, "control"]
    share = rows.pivot_table(index=keys, columns="signal_group", values="warned", aggfunc="mean")
    table = share.reindex(columns=list(dict.fromkeys(leads["signal_group"]))).astype(float)
    table.insert(0, "runs", rows.groupby(keys)["run_id"].nunique())
    table.columns.name = None
    return table.sort_index()


def signal_group_ablation(
    runs: Iterable,
    config=None,
    *,
    by: str = "family",
    drop: Iterable[str] | None = None,
    add: Iterable[str] = (),
    extra_context: Iterable[str] = (),
    progress=None,
    **settings,
) -> pd.DataFrame:
    """The model with every signal, then without each signal group of ``drop`` (default:
    every group the model reads), then with each group of ``add`` it does not read (the
    optimizer-state family: ``training.data.MODEL_SIGNALS`` leaves it out until this
    keeps it), then with each opt-in context field of
    ``extra_context`` (``features.context_fields.OPT_IN_CONTEXT``) and, for several, with
    all of them; each trained and tested leave-one-``by``-out
    (``training.holdout.leave_one_group_out``, no baselines; ``config`` and ``settings``
    as there).

    One row per variant (``signals``: ``all``, ``without <group>``, ``with <group>``,
    ``with <field>``, ``with extra context``): ``n_signals``, then the mean over held-out
    groups of the model at its stored warn level: ``recall``, ``median_lead``, ``fa_per_10k``;
    ``develops_recall``, the collapses that develop caught (pooled over the folds); and
    inside LR rises and outside (``evaluate.rises``): ``inside_fa_per_10k``,
    ``inside_roc_auc``, ``outside_fa_per_10k``, ``outside_roc_auc``.
    """
    from collapse_guard.predictor.evaluate import fold_rise_frame
    from collapse_guard.predictor.training.config import TrainConfig
    from collapse_guard.predictor.training.holdout import leave_one_group_out

    config = TrainConfig.of(config, **settings)
    group_of = signal_groups()
    present = list(dict.fromkeys(group_of[s] for s in config.signals if s in group_of))
    drop = present if drop is None else list(drop)
    unknown = sorted(set(drop) - set(present))
    if unknown:
        raise ValueError(
            f"drop names signal groups the model does not read: {unknown}; "
            f"it reads {present}. Fix: drop some of those"
        )
    add = list(add)
    absent = sorted({*group_of.values()} - set(present))
    read = sorted(set(add) - set(absent))
    if read:
        raise ValueError(
            f"add names {read}; the groups the model does not read are {absent}. "
            "Fix: add some of those"
        )
    variants = {"all": config} | {
        f"without {g}": config.replace(
            signals=tuple(s for s in config.signals if group_of.get(s) != g)
        )
        for g in drop
    }
    variants |= {
        f"with {g}": config.replace(
            signals=(*config.signals, *(s for s, of in group_of.items() if of == g))
        )
        for g in add
    }
    extra = tuple(extra_context)
    variants |= {f"with {n}": config.replace(extra_context=(n,)) for n in extra}
    if len(extra) > 1:
        variants["with extra context"] = config.replace(extra_context=extra)
    rates = ("inside_fa_per_10k", "inside_roc_auc", "outside_fa_per_10k", "outside_roc_auc")
    runs = list(runs)
    rows = []
    for name, variant in variants.items():
        if progress is not None:
            progress(f"ablation: {name} ({len(variant.signals)} signals)")
        holdout = leave_one_group_out(runs, variant, by=by, baselines=False, progress=progress)
        frame = holdout.frame()
        mean = frame[(frame["group"] == "mean") & (frame["scorer"] == "model")].iloc[0]
        rise = fold_rise_frame(holdout.folds).iloc[-1]
        rows.append(
            {
                "signals": name,
                "n_signals": len(variant.signals),
                **{k: mean[k] for k in ("recall", "median_lead", "fa_per_10k")},
                "develops_recall": _develops_recall(holdout),
                **{k: rise[k] for k in rates},
            }
        )
    return pd.DataFrame(rows)


def _develops_recall(holdout) -> float:
    """The collapses that develop caught by the model at its stored warn level, over every
    fold's held-out runs (NaN when there are none)."""
    counts = holdout.group_counts("onset")
    if "develops" not in counts.index or not counts.loc["develops", ("all", "n")]:
        return math.nan
    return counts.loc["develops", ("all", "caught")] / counts.loc["develops", ("all", "n")]
