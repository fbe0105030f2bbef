"""Event-level evaluation, as a user lives it (DESIGN.md "Predictor").

Every scorer (the model or a baseline) gives a score at *every* step of each test
run; a threshold turns scores into alarms, and consecutive alarmed steps are one
alarm episode. Then, with H the horizon:

- a collapse is *caught* when the first alarmed step in the H steps before onset,
  [onset - H, onset), comes at least ``min_lead`` (10) steps before onset. An episode
  already running when that stretch begins counts from its first step inside it: the
  user is being warned then;
- its *lead time* is onset minus that first alarmed step;
- a *false alarm* is an episode that starts on a healthy run, or on a collapsing run
  earlier than H steps before onset; *healthy steps* are those steps;
- *recall at budget* uses the lowest threshold (per scorer) at which false alarms per
  10,000 healthy steps of the evaluated runs stay within the budget, so every scorer is
  compared at the same false-alarm rate; the model is also reported at its stored
  level thresholds (set on validation runs: the figure a user gets) and each baseline
  at its native rule.

Row-level metrics over every step before onset: PR-AUC (average precision), ROC-AUC,
and the Brier score for scorers that give probabilities.

Per collapse kind (issue 4: "say which collapse kinds are missed"): the same event
metrics over the collapsing runs of one kind, at the same thresholds, grouped two ways:
``kind`` is the label's ``extra["collapse_kind"]`` (``nonfinite``, ``loss_rise``,
``grad_collapse``) and ``cause`` the generator's account of the mechanism (real runs'
``extra["collapse_cause"]``, e.g. ``fault_lr_jump``, ``entropy_collapse``; synthetic
runs' ``extra["synthetic_kind"]``); ``unknown`` where a run says nothing.

Lead time per signal family (:func:`family_leads`, "why" a kind is missed): for each
collapse and each signal family, the earliest step in the H steps before onset at
which any signal of the family left the run's own healthy range, where that range is
mean +- 4 std of the signal over the W steps before those H, [onset - H - W, onset - H)
(a sparse signal, e.g. attention every 50 steps, reaches back to its last 5
measurements), the 4 raised per signal until at most 5% of healthy runs "depart" in
their last H steps (so a signal that drifts by itself does not warn on every run). It
is a model-free account of how early each family carries warning for each kind; the
same rule on the last H steps of healthy runs (the ``healthy-control`` rows) says how
often a family departs with no collapse coming.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import average_precision_score, roc_auc_score

from collapse_guard.datasets.label import HORIZON, collapse_targets
from collapse_guard.predictor.levels import alarm_starts, threshold_for_episodes
from collapse_guard.signals import SIGNALS

__all__ = [
    "CONTROL_RATE",
    "DEPARTURE_STD",
    "FAMILIES",
    "HEALTHY_CONTROL",
    "KIND_GROUPINGS",
    "MIN_LEAD",
    "REFERENCE_STEPS",
    "UNKNOWN_KIND",
    "EvalReport",
    "ScoredRun",
    "cause_of",
    "evaluate_runs",
    "event_metrics",
    "family_lead_table",
    "family_leads",
    "healthy_sequences",
    "kind_metrics",
    "kind_of",
    "row_metrics",
    "signal_families",
    "threshold_at_budget",
]

MIN_LEAD = 10  # steps: an alarm later than this before onset leaves no time to act

_RESULT_COLUMNS = (
    "scorer",
    "source",
    "operating_point",
    "threshold",
    "n_runs",
    "n_collapsed",
    "caught",
    "recall",
    "median_lead",
    "false_alarms",
    "healthy_steps",
    "fa_per_10k",
    "pr_auc",
    "roc_auc",
    "brier",
)

# one row per (scorer, source, operating point, grouping, kind): EvalReport.by_kind
_KIND_COLUMNS = (
    "scorer",
    "source",
    "operating_point",
    "grouping",
    "kind",
    "threshold",
    "n_collapsed",
    "caught",
    "recall",
    "median_lead",
)
KIND_GROUPINGS = ("kind", "cause")
UNKNOWN_KIND = "unknown"  # a collapsing run whose metadata names no kind / cause


@dataclass(frozen=True)
class ScoredRun:
    """One run's per-step scores from one scorer."""

    run_id: str
    source: str
    steps: np.ndarray
    scores: np.ndarray
    onset_step: int | None
    kind: str | None = None  # the label's collapse kind (collapse_kind)
    cause: str | None = None  # the generator's cause (collapse_cause)


def kind_of(meta) -> str | None:
    """The label's kind of a collapsing run (``extra["collapse_kind"]``); None if healthy."""
    if meta.onset_step is None:
        return None
    return meta.extra.get("collapse_kind") or UNKNOWN_KIND


def cause_of(meta) -> str | None:
    """The generator's cause of a collapse: real runs' ``collapse_cause``, else
    synthetic runs' ``synthetic_kind``; None if healthy."""
    if meta.onset_step is None:
        return None
    return meta.extra.get("collapse_cause") or meta.extra.get("synthetic_kind") or UNKNOWN_KIND


def _pre_onset(run: ScoredRun) -> tuple[np.ndarray, np.ndarray]:
    if run.onset_step is None:
        return run.steps, run.scores
    keep = run.steps < run.onset_step
    return run.steps[keep], run.scores[keep]


def healthy_sequences(runs: Sequence[ScoredRun], horizon: int = HORIZON) -> list[np.ndarray]:
    """Scores at healthy steps: all of a healthy run, and a collapsing run before onset - H."""
    out = []
    for run in runs:
        if run.onset_step is None:
            out.append(np.asarray(run.scores, dtype=np.float64))
        else:
            out.append(np.asarray(run.scores[run.steps < run.onset_step - horizon], np.float64))
    return out


def threshold_at_budget(
    runs: Sequence[ScoredRun], budget_per_10k: float = 1.0, horizon: int = HORIZON
) -> float:
    """Lowest threshold with <= budget_per_10k false alarms per 10,000 healthy steps."""
    seqs = healthy_sequences(runs, horizon)
    healthy = sum(s.size for s in seqs)
    return threshold_for_episodes(seqs, budget_per_10k * healthy / 10_000)


def _outcome(
    run: ScoredRun, threshold: float, horizon: int, min_lead: int
) -> tuple[int | None, int, int]:
    """(lead time if caught else None, false alarms, healthy steps) of one run."""
    steps, scores = _pre_onset(run)
    starts = steps[alarm_starts(scores, threshold)]
    if run.onset_step is None:
        return None, int(starts.size), int(steps.size)
    early = run.onset_step - horizon
    false_alarms = int(np.sum(starts < early))
    healthy_steps = int(np.sum(steps < early))
    in_window = (steps >= early) & (np.nan_to_num(scores, nan=-np.inf) >= threshold)
    if in_window.any():
        first = int(steps[np.argmax(in_window)])
        if first <= run.onset_step - min_lead:
            return run.onset_step - first, false_alarms, healthy_steps
    return None, false_alarms, healthy_steps


def event_metrics(
    runs: Sequence[ScoredRun],
    threshold: float,
    *,
    horizon: int = HORIZON,
    min_lead: int = MIN_LEAD,
) -> dict[str, Any]:
    """Caught collapses, lead times and false alarms at ``threshold`` (module docstring)."""
    n_collapsed, false_alarms, healthy_steps = 0, 0, 0
    leads: list[int] = []
    for run in runs:
        lead, fa, healthy = _outcome(run, threshold, horizon, min_lead)
        false_alarms += fa
        healthy_steps += healthy
        if run.onset_step is not None:
            n_collapsed += 1
            if lead is not None:
                leads.append(lead)
    caught = len(leads)
    return {
        "n_runs": len(runs),
        "n_collapsed": n_collapsed,
        "caught": caught,
        "recall": caught / n_collapsed if n_collapsed else math.nan,
        "median_lead": float(np.median(leads)) if leads else math.nan,
        "lead_times": leads,
        "false_alarms": false_alarms,
        "healthy_steps": healthy_steps,
        "fa_per_10k": 1e4 * false_alarms / healthy_steps if healthy_steps else math.nan,
    }


def kind_metrics(
    runs: Sequence[ScoredRun],
    threshold: float,
    *,
    by: str = "kind",
    horizon: int = HORIZON,
    min_lead: int = MIN_LEAD,
) -> list[dict[str, Any]]:
    """Caught collapses, recall and median lead per collapse kind, at ``threshold``.

    ``by``: ``"kind"`` (the label's kind) or ``"cause"`` (the generator's). One dict per
    kind among the collapsing runs (sorted by kind); healthy runs are not counted, and
    false alarms are a property of the threshold, not of a kind (see event_metrics).
    """
    if by not in KIND_GROUPINGS:
        raise ValueError(f"by must be one of {KIND_GROUPINGS}, got {by!r}")
    leads: dict[str, list[int | None]] = {}
    for run in runs:
        if run.onset_step is None:
            continue
        kind = getattr(run, by) or UNKNOWN_KIND
        leads.setdefault(kind, []).append(_outcome(run, threshold, horizon, min_lead)[0])
    out = []
    for kind in sorted(leads):
        caught = [x for x in leads[kind] if x is not None]
        out.append(
            {
                "grouping": by,
                "kind": kind,
                "n_collapsed": len(leads[kind]),
                "caught": len(caught),
                "recall": len(caught) / len(leads[kind]),
                "median_lead": float(np.median(caught)) if caught else math.nan,
            }
        )
    return out


def _finite_scores(scores: np.ndarray) -> np.ndarray:
    # AUC needs finite scores: NaN (no opinion) ranks lowest, +inf (a measured NaN
    # loss) highest, keeping the order of everything else
    finite = scores[np.isfinite(scores)]
    lo, hi = (finite.min() - 1, finite.max() + 1) if finite.size else (0.0, 1.0)
    return np.nan_to_num(scores, nan=lo, posinf=hi, neginf=lo)


def row_metrics(
    runs: Sequence[ScoredRun], *, horizon: int = HORIZON, probabilistic: bool = False
) -> dict[str, Any]:
    """PR-AUC, ROC-AUC (and Brier when scores are probabilities) over pre-onset rows."""
    ys, ss = [], []
    for run in runs:
        y, usable = collapse_targets(run.steps, run.onset_step, horizon)
        ys.append(np.asarray(y)[usable])
        ss.append(np.asarray(run.scores, dtype=np.float64)[usable])
    y = np.concatenate(ys) if ys else np.empty(0)
    s = np.concatenate(ss) if ss else np.empty(0)
    out = {"pr_auc": math.nan, "roc_auc": math.nan, "brier": math.nan, "y": y, "score": s}
    if y.size and 0 < y.sum() < y.size:
        fs = _finite_scores(s)
        out["pr_auc"] = float(average_precision_score(y, fs))
        out["roc_auc"] = float(roc_auc_score(y, fs))
    if probabilistic and y.size:
        out["brier"] = float(np.mean((np.nan_to_num(s, nan=0.0) - y) ** 2))
    return out


@dataclass
class EvalReport:
    """Every scorer x source x operating point, plus what plots need.

    ``results``: one dict per row (keys ``_RESULT_COLUMNS``); ``lead_times``: scorer ->
    lead times of caught collapses at the budget, all sources; ``row_scores``: scorer ->
    {"y", "score"} arrays over pre-onset rows, all sources (for PR curves and the
    reliability diagram; not serialised); ``by_kind``: one dict per scorer x source x
    operating point x grouping (``kind`` or ``cause``) x kind (keys ``_KIND_COLUMNS``),
    at the same thresholds as ``results``.
    """

    horizon: int
    budget_per_10k: float
    min_lead: int
    results: list[dict[str, Any]]
    lead_times: dict[str, list[int]] = field(default_factory=dict)
    row_scores: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)
    by_kind: list[dict[str, Any]] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        """One row per (scorer, source, operating point)."""
        return pd.DataFrame(self.results, columns=list(_RESULT_COLUMNS))

    def kinds_frame(self) -> pd.DataFrame:
        """One row per (scorer, source, operating point, grouping, kind)."""
        return pd.DataFrame(self.by_kind, columns=list(_KIND_COLUMNS))

    def kind_table(
        self, grouping: str = "kind", source: str = "all", operating_point: str = "budget"
    ) -> pd.DataFrame:
        """Wide view of ``by_kind``: one row per kind, ``n`` then ``<scorer> recall`` and
        ``<scorer> lead`` for every scorer (the model first), at one operating point
        (each baseline at the budget; ``native`` gives each baseline's own rule)."""
        frame = self.kinds_frame()
        frame = frame[
            (frame["grouping"] == grouping)
            & (frame["source"] == source)
            & (frame["operating_point"] == operating_point)
        ]
        scorers = list(dict.fromkeys(frame["scorer"]))
        kinds = sorted(set(frame["kind"]))
        out = pd.DataFrame(index=pd.Index(kinds, name=grouping))
        for scorer in scorers:
            rows = frame[frame["scorer"] == scorer].set_index("kind")
            if "n" not in out:
                out["n"] = rows["n_collapsed"].reindex(kinds).astype("Int64")
            out[f"{scorer} recall"] = rows["recall"].reindex(kinds)
            out[f"{scorer} lead"] = rows["median_lead"].reindex(kinds)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (NaN becomes None)."""

        def clean(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            return v.item() if isinstance(v, np.generic) else v

        return {
            "horizon": self.horizon,
            "budget_per_10k": self.budget_per_10k,
            "min_lead": self.min_lead,
            "results": [{k: clean(v) for k, v in r.items()} for r in self.results],
            "lead_times": {k: [int(x) for x in v] for k, v in self.lead_times.items()},
            "by_kind": [{k: clean(v) for k, v in r.items()} for r in self.by_kind],
        }

    def get(
        self, scorer: str = "model", source: str = "all", operating_point: str = "budget"
    ) -> dict[str, Any]:
        """The result row for one scorer, source and operating point."""
        for r in self.results:
            if (r["scorer"], r["source"], r["operating_point"]) == (
                scorer,
                source,
                operating_point,
            ):
                return r
        have = sorted({(r["scorer"], r["source"], r["operating_point"]) for r in self.results})
        raise KeyError(
            f"no result for scorer={scorer!r}, source={source!r}, "
            f"operating_point={operating_point!r}; available: {have}"
        )

    def to_metrics(self) -> dict[str, float]:
        """Flat ``scorer/source/operating_point/metric`` -> finite float (for MLflow).

        Per kind, at the budget and over all sources:
        ``scorer/all/budget/<grouping>/<kind>/{n_collapsed,recall,median_lead}``.
        """
        out = {}
        for r in self.results:
            prefix = f"{r['scorer']}/{r['source']}/{r['operating_point']}"
            for key in _RESULT_COLUMNS[3:]:
                v = r[key]
                if isinstance(v, (int, float, np.number)) and math.isfinite(float(v)):
                    out[f"{prefix}/{key}"] = float(v)
        for r in self.by_kind:
            if (r["source"], r["operating_point"]) != ("all", "budget"):
                continue
            kind = re.sub(r"[^\w.\- ]", "_", str(r["kind"]))  # MLflow's metric name rule
            prefix = f"{r['scorer']}/all/budget/{r['grouping']}/{kind}"
            for key in ("n_collapsed", "recall", "median_lead"):
                v = r[key]
                if isinstance(v, (int, float, np.number)) and math.isfinite(float(v)):
                    out[f"{prefix}/{key}"] = float(v)
        return out


def _scored(runs: Sequence, scores: Sequence[np.ndarray]) -> list[ScoredRun]:
    return [
        ScoredRun(
            r.run_id,
            r.meta.source,
            r.frame["step"].to_numpy(),
            np.asarray(s, float),
            r.meta.onset_step,
            kind_of(r.meta),
            cause_of(r.meta),
        )
        for r, s in zip(runs, scores, strict=True)
    ]


def _rows_for(
    name: str,
    scored: list[ScoredRun],
    thresholds: Mapping[str, float],
    *,
    horizon: int,
    min_lead: int,
    probabilistic: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    rows, kind_rows, budget_extras = [], [], {}
    sources = ["all", *sorted({r.source for r in scored})]
    for source in sources:
        subset = scored if source == "all" else [r for r in scored if r.source == source]
        rm = row_metrics(subset, horizon=horizon, probabilistic=probabilistic)
        for point, thr in thresholds.items():
            em = event_metrics(subset, thr, horizon=horizon, min_lead=min_lead)
            key = {"scorer": name, "source": source, "operating_point": point}
            rows.append(
                {
                    **key,
                    "threshold": float(thr),
                    **{k: v for k, v in em.items() if k != "lead_times"},
                    "pr_auc": rm["pr_auc"],
                    "roc_auc": rm["roc_auc"],
                    "brier": rm["brier"],
                }
            )
            for by in KIND_GROUPINGS:
                for km in kind_metrics(subset, thr, by=by, horizon=horizon, min_lead=min_lead):
                    kind_rows.append({**key, "threshold": float(thr), **km})
            if source == "all" and point == "budget":
                budget_extras = {"lead_times": em["lead_times"], "y": rm["y"], "score": rm["score"]}
    return rows, kind_rows, budget_extras


def evaluate_runs(
    runs: Sequence,
    model=None,
    baselines: Sequence = (),
    *,
    budget_per_10k: float = 1.0,
    horizon: int | None = None,
    min_lead: int = MIN_LEAD,
    model_scores: Sequence[np.ndarray] | None = None,
) -> EvalReport:
    """Evaluate a RiskModel and baselines on ``runs`` (``RunRecord``s), every step scored.

    ``model_scores`` (one array per run, aligned with its rows) skips re-scoring when the
    caller already has them. Without a model, only the baselines are reported.
    """
    if horizon is None:
        horizon = model.horizon if model is not None else HORIZON
    # (name, per-step scores, native alarms or None, extra operating points, probabilistic)
    scorers: list[tuple[str, Callable, Callable | None, dict, bool]] = []
    if model is not None or model_scores is not None:
        precomputed = iter(model_scores) if model_scores is not None else None

        def score_model(frame: pd.DataFrame) -> np.ndarray:
            if precomputed is not None:
                return next(precomputed)
            # scored at the recorded rows, like the baselines (not across row gaps)
            return model.predict_run(frame, steps=frame["step"].to_numpy()).to_numpy()

        levels = {f"level:{k}": v for k, v in (model.thresholds if model else {}).items()}
        scorers.append(("model", score_model, None, levels, True))
    for b in baselines:
        scorers.append((b.name, b.score_run, b.alarm_run, {}, b.name == "config_only"))
    report = EvalReport(
        horizon=horizon, budget_per_10k=budget_per_10k, min_lead=min_lead, results=[]
    )
    for name, score_fn, alarm_fn, extra_points, probabilistic in scorers:
        scored = _scored(runs, [score_fn(r.frame) for r in runs])
        points = {"budget": threshold_at_budget(scored, budget_per_10k, horizon), **extra_points}
        kwargs = {"horizon": horizon, "min_lead": min_lead}
        rows, kind_rows, extras = _rows_for(
            name, scored, points, probabilistic=probabilistic, **kwargs
        )
        if alarm_fn is not None:
            # the native rule is a 0/1 score thresholded at 0.5; its AUCs are those of the rule
            native = _scored(runs, [alarm_fn(r.frame).astype(float) for r in runs])
            native_rows, native_kinds, _ = _rows_for(
                name, native, {"native": 0.5}, probabilistic=False, **kwargs
            )
            rows += native_rows
            kind_rows += native_kinds
        report.results.extend(rows)
        report.by_kind.extend(kind_rows)
        report.lead_times[name] = extras.get("lead_times", [])
        report.row_scores[name] = {"y": extras.get("y"), "score": extras.get("score")}
    return report


# --------------------------------------------------------------------------- family leads

REFERENCE_STEPS = 200  # W: the feature window; the healthy range is taken over these steps
DEPARTURE_STD = 4.0  # a signal departs when beyond mean +- (at least) this many std
CONTROL_RATE = 0.05  # most healthy runs a signal may "depart" on (sets its multiple)
MIN_REFERENCE_POINTS = 5  # measurements a signal needs to define its healthy range
MIN_CONTROLS = 10  # healthy runs a signal needs before its multiple is calibrated
HEALTHY_CONTROL = "healthy-control"  # the kind given to healthy runs' (control) rows


def signal_families() -> dict[str, str]:
    """Signal name -> family, from collapse_guard.signals.SIGNALS.

    ``lr`` is taken out of ``output`` into a family of its own, ``config``: it is a
    setting the loop hands the probe, not a measurement of the model (the config-only
    baseline covers it), and a schedule moves it without any instability.
    """
    families = {s.name: s.family for s in SIGNALS}
    families["lr"] = "config"
    return families


FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(signal_families().values()))


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


def family_leads(
    runs: Iterable,
    *,
    horizon: int = HORIZON,
    reference: int = REFERENCE_STEPS,
    n_std: float = DEPARTURE_STD,
    control_rate: float | None = CONTROL_RATE,
    min_points: int = MIN_REFERENCE_POINTS,
    families: Mapping[str, str] | None = None,
    controls: bool = True,
) -> pd.DataFrame:
    """How early each signal family departed from its healthy range before each collapse.

    ``runs``: ``RunRecord``s (``frame`` with ``step`` and signal columns, ``meta``). For
    each collapsing run and each family (``families``: signal -> family, default
    :func:`signal_families`) the *family lead* is onset minus the first step in
    [onset - H, onset) at which any signal of the family lies beyond mean +- k std of
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
    (at most ``control_rate`` per signal by construction; a family of several signals
    can exceed it), so read a family's share on a kind against it, not as a test.

    Returns one row per (run, family): ``run_id, source, kind, cause, onset_step,
    control, family, n_signals`` (signals of the family with a healthy range; 0 means
    the family was not measured), ``lead`` (steps; NaN when nothing departed) and
    ``first_signal`` (the signal that departed first).
    """
    families = dict(families) if families is not None else signal_families()
    order = list(dict.fromkeys(families.values()))
    measured = []  # (meta, onset, control, {signal: (steps, z)})
    for run in runs:
        meta, frame = run.meta, run.frame.sort_values("step")
        steps = frame["step"].to_numpy()
        if not steps.size:
            continue
        control = meta.onset_step is None
        onset = int(steps[-1]) + 1 if control else int(meta.onset_step)
        found = {}
        for name in frame.columns:
            if name in families:
                values = frame[name].to_numpy(dtype=np.float64, na_value=np.nan)
                dep = _departures(steps, values, onset, horizon, reference, min_points)
                if dep is not None:
                    found[name] = dep
        if control and not found:
            continue  # too short for any healthy range: no control
        measured.append((meta, onset, control, found))

    multiples = {}
    for name in families:
        peaks = [
            found[name][1].max(initial=0.0) for _, _, c, found in measured if c and name in found
        ]
        k = n_std
        if control_rate is not None and len(peaks) >= MIN_CONTROLS:
            k = max(n_std, float(np.quantile(peaks, 1 - control_rate, method="higher")))
        multiples[name] = k

    rows = []
    for meta, onset, control, found in measured:
        if control and not controls:
            continue
        if control:
            kind = cause = HEALTHY_CONTROL
        else:
            kind, cause = kind_of(meta), cause_of(meta)
        for family in order:
            leads = [
                (_first_departure(onset, st, z, multiples[name]), name)
                for name, (st, z) in found.items()
                if families[name] == family
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
                    "family": family,
                    "n_signals": len(leads),
                    "lead": lead,
                    "first_signal": first,
                }
            )
    columns = ["run_id", "source", "kind", "cause", "onset_step", "control", "family"]
    out = pd.DataFrame(rows, columns=[*columns, "n_signals", "lead", "first_signal"])
    out.attrs["n_std"] = multiples
    return out


def family_lead_table(
    leads: pd.DataFrame, *, by: str = "kind", min_lead: int = MIN_LEAD
) -> pd.DataFrame:
    """Summary of :func:`family_leads` per kind (``by``: ``kind`` or ``cause``) x family.

    Columns: ``n`` (runs of the kind where the family was measured), ``warned`` (of
    those, runs where it departed at least ``min_lead`` steps before onset), ``share``
    (warned / n), ``median_lead`` (over the warned runs) and ``top_signal`` (the signal
    that most often departed first among them). The healthy control rows come last.
    """
    out = []
    for (kind, family), group in leads.groupby([by, "family"], sort=False):
        measured = group[group["n_signals"] > 0]
        warned = measured[measured["lead"] >= min_lead]
        top = Counter(warned["first_signal"]).most_common(1)
        out.append(
            {
                by: kind,
                "family": family,
                "n": len(measured),
                "warned": len(warned),
                "share": len(warned) / len(measured) if len(measured) else math.nan,
                "median_lead": float(warned["lead"].median()) if len(warned) else math.nan,
                "top_signal": top[0][0] if top else None,
            }
        )
    table = pd.DataFrame(
        out, columns=[by, "family", "n", "warned", "share", "median_lead", "top_signal"]
    )
    family_order = {f: i for i, f in enumerate(dict.fromkeys(leads["family"]))}
    table["_control"] = table[by] == HEALTHY_CONTROL
    table["_family"] = table["family"].map(family_order)
    table = table.sort_values(["_control", by, "_family"], kind="stable")
    return table.drop(columns=["_control", "_family"]).reset_index(drop=True)
