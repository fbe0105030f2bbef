"""The collapse label: where a run stops learning and does not come back.

One versioned rule (docs/design.md, "The label"), applied to every run from
every source. ``label_run(frame)`` returns the onset step (or None), the kind of
collapse and the spikes the run recovered from.

The rule, on the training loss of each step:

1. The loss is smoothed by an EWMA over *steps*, not rows (time constant
   ``LabelRule.smooth_steps``), so a log written every 100 steps is smoothed as
   much as its gaps allow and unmeasured rows (NaN loss, ``loss_nonfinite`` != 1)
   are skipped, never filled.
2. The run's *best level* is the lowest smoothed loss seen so far. An *excursion*
   starts at the first step where the smoothed loss exceeds ``best + margin``,
   ``margin = max(abs_margin, rel_margin * best)`` (relative, hence scale-aware), and
   ends at the first step where it is back at or below that line.
3. An excursion that ends within the recovery window (``recovery_steps``, widened
   to ``recovery_frac`` of the steps done at its start for long runs) is a
   :class:`Spike`: a hard negative, not a collapse. One that does not end within the
   window is a collapse whose onset is the *first* step of the excursion (where it
   crossed the line, not where it was confirmed). One still open when the run ends
   counts only if it lasted ``tail_min_steps`` steps and ``tail_min_rows`` rows
   (a rise in the last few steps is not yet evidence of anything).
4. A measured non-finite loss (``loss_nonfinite == 1`` or +-inf) opens an excursion
   too; if the loss is not back near its best level within the window, or the run
   ends first (whatever its length), the collapse kind is ``"nonfinite"``. After a
   non-finite loss the EWMA restarts from the next finite loss.
5. A gradient-norm drop of ``grad_drop_ratio`` or more within one step (the seed's
   "falls by three orders of magnitude") turns a collapse within
   ``grad_link_steps`` of it into ``"grad_collapse"``, with onset at the drop if
   that came first. A drop with the loss still near its best does not count: the
   run's loss says it still works.
6. In a run logged from the start of training (first measured step <=
   ``settle_steps``), excursions cannot start in the first ``settle_steps`` steps
   (the first optimizer steps often overshoot before the loss falls, faster than the
   EWMA follows). An excerpt that starts mid-training counts from its first step.
   Non-finite losses count from the first step.

Targets for training (``collapse_targets``): at step t, y = 1 when the onset lies in
(t, t + horizon]; rows at and after the onset are not prediction rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from collapse_guard.runfiles.format import RunMeta

__all__ = [
    "COLLAPSE_KINDS",
    "HORIZON",
    "LABEL_VERSION",
    "MIN_LEAD",
    "RULE_NAME",
    "Label",
    "LabelRule",
    "Spike",
    "apply_label",
    "collapse_targets",
    "is_unlabelled",
    "label_run",
    "label_unlabelled",
]

# Bump on any change of the rule or of a LabelRule default: stored labels name it.
LABEL_VERSION: str = "2"
HORIZON: int = 200  # docs/design.md: predict collapse within the next 200 steps
# docs/design.md, "Predictor": an alarm counts only this many steps or more before onset;
# a later one leaves no time to act (the guard's reactive path covers those collapses)
MIN_LEAD: int = 10
# "rescued": a guarded run's rescue with no excursion open, its onset the rescue's step
# (censoring.py); label_run itself finds the other three
COLLAPSE_KINDS: tuple[str, ...] = ("nonfinite", "loss_rise", "grad_collapse", "rescued")
# How a command names the rule when it labels a run the file left unlabelled
RULE_NAME: str = (
    f"label rule {LABEL_VERSION!r} (collapse_guard.runfiles.label_run, the rule the data "
    "generators label their runs with)"
)


@dataclass(frozen=True)
class LabelRule:
    """The label's constants, each with the evidence it rests on.

    Sources: small runs measured here (issue 3: healthy runs rose at most 0.23 nats
    above their best smoothed loss; entropy collapses rose 0.28-0.89 nats over
    100-200 steps and stayed), AlgoPerf v0.5/v0.6 training logs (WMT transformers,
    Conformers; loss logged every 100 steps; 437 recovered loss spikes in
    ``../shared/realdata/derived/algoperf_events.csv``), the modded-nanogpt speedrun
    logs (every step; single-step spikes > 1 nat at the same steps across seeds,
    gone the next step) and the seed (large models: 2.3-2.8 -> > 10 at collapse).
    """

    # EWMA time constant in steps. 10 steps cuts per-batch noise about 4x (std of an
    # EWMA of white noise: sqrt(a / (2 - a)), a = 1 - exp(-1/10)) yet lags a rise by
    # only ~10 steps, well inside the 100-200 steps small collapses take to rise. A
    # one-step modded-nanogpt spike of 1-1.3 nats moves it by 0.1-0.12: below the margin.
    smooth_steps: float = 10.0
    # Cap on the weight of a single row (1.0 = no cap). Capping it at 0.5, so that
    # logs every 100 steps average ~3 rows, made things worse on AlgoPerf: 19 of 267
    # recovered spikes got an onset instead of 4, because isolated spikes kept the
    # average up. Kept as a knob for noisier sparse logs.
    max_row_weight: float = 1.0
    # Smallest rise that counts, in nats: between the worst healthy excursion
    # measured here (0.23) and the smallest collapse (0.28).
    abs_margin: float = 0.25
    # Rise as a fraction of the best level, for large losses: 10% is where AlgoPerf's
    # spike events count as recovered ("back within 10% of the baseline"), and is
    # 0.25 nats at the 2.5 nats of a healthy small run, so the two margins meet there.
    # At the seed's scale (2.5 -> >10) any collapse is far above it.
    rel_margin: float = 0.10
    # An excursion ends when the smoothed loss is back within this share of the
    # margin above the best level. 1.0 = back under the line it crossed. Hysteresis
    # (0.5) was tried: on AlgoPerf it turned 10-15 more recovered spikes into
    # collapses (spiky schedule-free runs hover near the line) for no gain.
    recover_frac: float = 1.0
    # Recovery window, in steps. AlgoPerf's recovered spikes (loss logged every 100
    # steps) came back within 500 steps in 62% of cases, within 2,000 in 75%; the
    # slow ones (caspr_adaptive WMT: 8-55-nat spikes at steps 4,600-8,700) took
    # 2,400-2,800 steps and then trained on normally. Small runs here last 2,000
    # steps and their collapses stay up to the end, so there the tail rule decides.
    recovery_steps: int = 3000
    # For long runs the window widens to this share of the steps done when the
    # excursion started: AlgoPerf spikes at 13k-25k steps took up to 4,000-9,500
    # steps to come back (90th percentile of recovery/step: 0.29).
    recovery_frac: float = 0.25
    # An excursion still open at the end of the run is a collapse only if it lasted
    # this long: a 50-step EWMA excursion is 5 time constants, so not one noisy batch.
    tail_min_steps: int = 50
    # ... and was seen on this many measured rows (with logs every 100 steps, one
    # or two high last points are not a collapse).
    tail_min_rows: int = 3
    # No excursion may start this soon after the first measured loss *of a run logged
    # from the start of training* (first measured step <= settle_steps): the first
    # optimizer steps often overshoot before the loss falls (modded-nanogpt: 11.0 ->
    # 11.0 before falling), and the EWMA, started from one value, needs ~3 time
    # constants to catch up with a loss falling that fast. An excerpt that starts
    # mid-training (BigScience chronicle blocks: iterations 31214-..., spike at 31219)
    # has neither: its loss is near its level, so the EWMA starts at the first value
    # and excursions count from the first step. A high first value only makes the
    # best level fall as the EWMA settles (no excursion); a low one would bias it in
    # either case. Counting from the first logged step there would hide a spike in
    # the excerpt's first 30 steps, the very event it was cut around.
    settle_steps: int = 30
    # The seed's gradient-norm collapse: down by three orders of magnitude ...
    grad_drop_ratio: float = 1e3
    # ... within one step (between measured rows at most this many steps apart).
    grad_drop_max_gap: int = 1
    # A drop this close to a loss collapse's first step is its cause: the EWMA lags
    # ~10 steps and a loss takes some tens of steps to move once gradients die.
    grad_link_steps: int = 50

    def __post_init__(self) -> None:
        for name in ("smooth_steps", "recovery_steps", "grad_drop_ratio"):
            if not getattr(self, name) > 0:
                raise ValueError(f"LabelRule.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("abs_margin", "rel_margin", "recovery_frac", "tail_min_steps", "settle_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"LabelRule.{name} must be >= 0, got {getattr(self, name)!r}")

    def margin(self, best: float) -> float:
        """How far above the best smoothed level the loss must rise to count."""
        return max(self.abs_margin, self.rel_margin * abs(best))

    def settled_from(self, first_step: int) -> int:
        """First step at which an excursion may start in a run first measured at ``first_step``."""
        return first_step + self.settle_steps if first_step <= self.settle_steps else first_step

    def window(self, start_step: int, first_step: int) -> float:
        """Recovery window, in steps, for an excursion starting at ``start_step``."""
        return max(self.recovery_steps, self.recovery_frac * (start_step - first_step))


@dataclass(frozen=True)
class Spike:
    """A loss excursion the run recovered from (a hard negative, not a collapse).

    ``start``: first step above the margin; ``peak``: step of the highest raw loss
    (first non-finite step if any); ``end``: first step back under the margin;
    ``height``: peak loss minus the best smoothed level before it, nats (inf for a
    non-finite loss).
    """

    start: int
    peak: int
    end: int
    height: float

    def to_dict(self) -> dict:
        return {"start": self.start, "peak": self.peak, "end": self.end, "height": self.height}


@dataclass(frozen=True)
class Label:
    """What the label says about one run."""

    onset_step: int | None
    kind: str | None  # one of COLLAPSE_KINDS, None when the run did not collapse
    spikes: tuple[Spike, ...] = ()
    version: str = LABEL_VERSION
    # Step at which the collapse became certain (window passed or run ended); for
    # inspection only, the targets use onset_step.
    confirmed_step: int | None = field(default=None, compare=False)

    @property
    def collapsed(self) -> bool:
        return self.onset_step is not None


# --------------------------------------------------------------------------- input


@dataclass
class _Trace:
    steps: np.ndarray  # int64, strictly increasing
    loss: np.ndarray  # float64
    nonfinite: np.ndarray  # bool: a measured non-finite loss
    grad: np.ndarray  # float64, NaN when not measured


def _trace(frame: pd.DataFrame) -> _Trace:
    missing = [c for c in ("step", "loss") if c not in frame.columns]
    if missing:
        raise ValueError(
            f"label_run needs columns 'step' and 'loss'; missing {missing} "
            f"(got {list(frame.columns)[:8]}...): read runs with read_run()"
        )
    steps = frame["step"].to_numpy()
    if len(steps) and not np.issubdtype(steps.dtype, np.integer):
        if not np.all(np.isfinite(steps.astype(float))):
            raise ValueError("label_run: 'step' holds NaN; every row needs its step number")
    steps = steps.astype(np.int64)
    if len(steps) > 1 and np.any(np.diff(steps) <= 0):
        bad = int(np.argmax(np.diff(steps) <= 0)) + 1
        raise ValueError(
            f"label_run: steps must strictly increase, row {bad} has step {steps[bad]} "
            f"after {steps[bad - 1]}; sort by step and drop duplicate rows first"
        )
    loss = frame["loss"]
    if not pd.api.types.is_numeric_dtype(loss.dtype):
        loss = pd.to_numeric(loss, errors="coerce")
    loss = loss.to_numpy(dtype=np.float64)
    flagged = np.zeros(len(loss), dtype=bool)
    if "loss_nonfinite" in frame.columns:
        flagged = frame["loss_nonfinite"].to_numpy(dtype=np.float64) == 1.0
    # A NaN loss is "not measured" unless flagged; an infinite loss was measured.
    nonfinite = np.isinf(loss) | (flagged & ~np.isfinite(loss))
    grad = (
        frame["grad_norm"].to_numpy(dtype=np.float64)
        if "grad_norm" in frame.columns
        else np.full(len(loss), np.nan)
    )
    return _Trace(steps, loss, nonfinite, grad)


# --------------------------------------------------------------------------- smoothing


def _smoothed(trace: _Trace, rule: LabelRule, rows: np.ndarray) -> np.ndarray:
    """EWMA over steps of the finite losses at ``rows``, restarted after each non-finite one."""
    if not rows.size:
        return np.empty(0)
    # the weight of a row depends only on its gap in steps to the previous finite loss
    gaps, which = np.unique(np.diff(trace.steps[rows]), return_inverse=True)
    tau, cap = rule.smooth_steps, rule.max_row_weight
    weights = [min(1.0 - math.exp(-g / tau), cap) for g in gaps.tolist()]
    weight = np.empty(len(rows))
    weight[0] = 1.0
    weight[1:] = np.asarray(weights, dtype=np.float64)[which]
    # a non-finite loss between two finite ones restarts the average (weight 1)
    weight[1:][np.diff(np.cumsum(trace.nonfinite)[rows]) > 0] = 1.0
    return _ewma(trace.loss[rows], weight)


# Largest exp() a stretch of _ewma scales by: sums stay finite for |loss| < 1e40.
_EWMA_SPAN = 600.0


def _ewma(x: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``s[i] = s[i-1] + a[i] * (x[i] - s[i-1])``, restarting at ``s[i] = x[i]`` where
    ``a[i] == 1`` (``a[0]`` must be 1), with no Python loop over rows.

    Closed form: ``s[i] = sum_k a[k] x[k] prod_(k<j<=i) (1 - a[j])``, one cumulative sum
    once term k is scaled by ``exp(C[i0] - C[k])``, ``C`` the running sum of
    ``log(1 - a)``; a restart drops the sum before it. A new stretch (one more loop
    turn, carrying the last value) begins where ``C`` has fallen by ``_EWMA_SPAN``, so
    the scale stays finite: once per ~6,000 steps of smoothing. Agrees with the loop to
    ~1e-15 relative (rounding, not the rule).
    """
    keep = 1.0 - a  # share of the previous average kept
    restart = keep <= 0.0
    fallen = np.cumsum(np.log(np.where(restart, 1.0, keep)))
    out = np.empty(len(x))
    lo, carry = 0, 0.0
    while lo < len(x):
        fell = fallen[lo] - fallen[lo:]  # >= 0, non-decreasing
        end = lo + max(1, int(np.searchsorted(fell, _EWMA_SPAN, side="right")))
        fell, hit = fell[: end - lo], restart[lo:end]
        terms = np.where(hit, 1.0, a[lo:end]) * x[lo:end] * np.exp(fell)
        terms[0] += keep[lo] * carry
        total = np.cumsum(terms)
        last = np.maximum.accumulate(np.where(hit, np.arange(end - lo), 0))
        total -= np.where(last > 0, total[last - 1], 0.0)
        out[lo:end] = np.exp(-fell) * total
        lo, carry = end, float(out[end - 1])
    return out


# --------------------------------------------------------------------------- excursions


@dataclass
class _Outcome:
    onset: int | None = None
    kind: str | None = None
    confirmed: int | None = None
    spikes: list[Spike] = field(default_factory=list)


class _Scanner:
    """Smooth, track the best level, find excursions: one excursion at a time, in numpy.

    Equivalent to a forward pass over the rows (the rule in the module docstring),
    but each stretch between excursions and each excursion is settled by a few
    array operations: between excursions the best level is a running minimum, and
    an open excursion ends at the first of: back under its line (a spike), past its
    recovery window (a collapse), end of the run (the tail rule).
    """

    def __init__(self, trace: _Trace, rule: LabelRule) -> None:
        self.t, self.rule = trace, rule
        self.n = len(trace.steps)
        self.bad = np.flatnonzero(trace.nonfinite)  # rows with a measured non-finite loss
        self.fin = np.flatnonzero(np.isfinite(trace.loss))  # rows with a finite loss
        first = np.union1d(self.bad[:1], self.fin[:1])
        self.first_step = int(trace.steps[first[0]]) if first.size else 0
        self.value = _smoothed(trace, rule, self.fin)  # smoothed loss at self.fin
        # per row (and one past the end): position in self.fin of the first finite loss
        # at or after it, and the first non-finite row at or after it (n if none)
        self.fin_from = np.searchsorted(self.fin, np.arange(self.n + 1)).tolist()
        next_bad = np.full(self.n + 1, self.n)
        next_bad[self.bad] = self.bad
        self.bad_from = np.minimum.accumulate(next_bad[::-1])[::-1].tolist()
        self.settled = trace.steps[self.fin] >= rule.settled_from(self.first_step)
        self.out = _Outcome()

    def run(self) -> _Outcome:
        row, best = 0, math.inf
        while (found := self._next_excursion(row, best)) is not None:
            start, best, by_bad = found
            row = self._follow(start, best, by_bad)
            if row is None:
                break
        return self.out

    def _next_excursion(self, row: int, best: float) -> tuple[int, float, bool] | None:
        """First excursion from ``row`` on: (its row, best level before it, opened by a
        non-finite loss), or None when the run ends without one."""
        rule, bad = self.rule, self.bad_from[row]
        lo, hi = self.fin_from[row], self.fin_from[bad]
        values = self.value[lo:hi]
        if values.size:
            before = np.minimum.accumulate(np.concatenate(([best], values[:-1])))
            margin = np.maximum(rule.abs_margin, rule.rel_margin * np.abs(before))
            cross = self.settled[lo:hi] & np.isfinite(before) & (values > before + margin)
            if cross.any():
                j = int(np.argmax(cross))
                return int(self.fin[lo + j]), float(before[j]), False
            best = min(best, float(values.min()))
        return (bad, best, True) if bad < self.n else None

    def _follow(self, start: int, best: float, by_bad: bool) -> int | None:
        """Follow the excursion opened at row ``start``: record it as a spike and return
        the row where it ended, or record the collapse (or nothing) and return None."""
        t, rule = self.t, self.rule
        start_step = int(t.steps[start])
        back = self._back_line(best)
        # confirmed: first row past the recovery window (checked before that row counts);
        # for whole steps, step - start > window <=> step > start + floor(window)
        last_in = start_step + math.floor(rule.window(start_step, self.first_step))
        confirm = int(np.searchsorted(t.steps, last_in, side="right"))
        # recovered: first finite loss after the start whose smoothed value is back
        k = self.fin_from[start + 1]
        home = self.value[k:] <= back
        end = int(self.fin[k + int(np.argmax(home))]) if home.any() else self.n
        went_bad = by_bad or self.bad_from[start] < confirm
        if confirm <= end and confirm < self.n:
            self._collapse(start, went_bad, confirm)
        elif end < self.n:
            self._spike(start, end, best)
            return end
        elif went_bad:  # still open at the end of the run, after a non-finite loss
            self._collapse(start, True, self.n - 1)
        else:  # still open at the end: a collapse only if it lasted (rows: finite losses)
            rows = 1 + len(self.fin) - k
            lasted = int(t.steps[-1]) - start_step >= rule.tail_min_steps
            if lasted and rows >= rule.tail_min_rows:
                self._collapse(start, False, self.n - 1)
        return None

    def _back_line(self, best: float) -> float:
        """Level the smoothed loss must come back to for the run to have recovered."""
        if not math.isfinite(best):  # nothing learned yet: any finite loss will do
            return math.inf
        return best + self.rule.recover_frac * self.rule.margin(best)

    def _spike(self, start: int, end: int, best: float) -> None:
        """Record the excursion from row ``start`` to row ``end`` (back) as a spike."""
        steps, loss = self.t.steps, self.t.loss
        first_bad = self.bad_from[start]
        if first_bad < end:
            peak_row, peak = first_bad, math.inf
        else:
            rows = self.fin[self.fin_from[start] : self.fin_from[end]]
            peak_row = int(rows[int(np.argmax(loss[rows]))])
            peak = float(loss[peak_row])
        height = peak - best if math.isfinite(best) else math.inf
        spike = Spike(int(steps[start]), int(steps[peak_row]), int(steps[end]), float(height))
        self.out.spikes.append(spike)

    def _collapse(self, start: int, nonfinite: bool, confirmed_row: int) -> None:
        out = self.out
        out.onset = int(self.t.steps[start])
        out.kind = "nonfinite" if nonfinite else "loss_rise"
        out.confirmed = int(self.t.steps[confirmed_row])


# --------------------------------------------------------------------------- gradient


def _grad_drops(trace: _Trace, rule: LabelRule) -> np.ndarray:
    """Steps where the gradient norm fell by ``grad_drop_ratio`` or more in one step."""
    ok = np.isfinite(trace.grad) & (trace.grad >= 0)
    steps, grad = trace.steps[ok], trace.grad[ok]
    if len(grad) < 2:
        return np.empty(0, dtype=np.int64)
    prev, now = grad[:-1], grad[1:]
    close = np.diff(steps) <= rule.grad_drop_max_gap
    with np.errstate(divide="ignore", invalid="ignore"):
        dropped = (prev > 0) & (now * rule.grad_drop_ratio <= prev)
    return steps[1:][close & dropped]


def _link_grad_drop(out: _Outcome, trace: _Trace, rule: LabelRule) -> None:
    if out.onset is None or out.kind == "nonfinite":
        return
    drops = _grad_drops(trace, rule)
    near = drops[np.abs(drops - out.onset) <= rule.grad_link_steps]
    if near.size:
        out.onset, out.kind = min(out.onset, int(near[0])), "grad_collapse"
        out.spikes = [s for s in out.spikes if s.end <= out.onset]


# --------------------------------------------------------------------------- public


def label_run(frame: pd.DataFrame, rule: LabelRule | None = None) -> Label:
    """Find the collapse onset of one run (or None), its kind and its recovered spikes.

    ``frame`` needs ``step`` and ``loss``; ``grad_norm`` and ``loss_nonfinite`` are
    used when present. Steps may have gaps (a log every 100 steps); a NaN loss with
    ``loss_nonfinite`` != 1 means "not measured" and is skipped.
    """
    rule = LabelRule() if rule is None else rule
    trace = _trace(frame)
    if len(trace.steps) == 0:
        return Label(onset_step=None, kind=None)
    out = _Scanner(trace, rule).run()
    _link_grad_drop(out, trace, rule)
    return Label(
        onset_step=out.onset,
        kind=out.kind,
        spikes=tuple(out.spikes),
        confirmed_step=out.confirmed,
    )


def apply_label(meta: RunMeta, label: Label) -> RunMeta:
    """A copy of ``meta`` carrying the label: onset, version, kind and spikes."""
    extra = {
        **meta.extra,
        "collapse_kind": label.kind,
        "spikes": [s.to_dict() for s in label.spikes],
    }
    return replace(meta, onset_step=label.onset_step, label_version=label.version, extra=extra)


def is_unlabelled(meta: RunMeta) -> bool:
    """No label at all: no onset and no label version (a run ``Probe.record_to`` recorded,
    or one imported without a label)."""
    return meta.onset_step is None and meta.label_version is None


def label_unlabelled(frame: pd.DataFrame, meta: RunMeta) -> tuple[RunMeta, bool]:
    """``(meta, labelled_now)``: ``meta`` labelled by :func:`label_run` on ``frame`` when it
    carries no label, else as it is.

    Left as they are: a labelled run (its label is :mod:`relabel`'s business), a raw guarded
    run (its label needs its censoring: ``runfiles.censoring``) and a run without a loss
    value (the rule reads the loss: without one it would call any run healthy).
    """
    measured = "loss" in frame.columns and bool(frame["loss"].notna().any())
    if not is_unlabelled(meta) or meta.source == "guarded" or not measured:
        return meta, False
    return apply_label(meta, label_run(frame)), True


def collapse_targets(
    steps: Sequence[int] | np.ndarray, onset_step: int | None, horizon: int = HORIZON
) -> tuple[np.ndarray, np.ndarray]:
    """Training targets per row: ``(y, usable)``.

    ``y`` (int8) is 1 when the onset lies in (step, step + horizon]; ``usable`` (bool)
    is False at and after the onset, where there is nothing left to predict.
    """
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ValueError(f"horizon must be an int >= 1 (steps), got {horizon!r}")
    steps = np.asarray(steps, dtype=np.int64)
    if onset_step is None:
        return np.zeros(len(steps), dtype=np.int8), np.ones(len(steps), dtype=bool)
    ahead = onset_step - steps
    y = ((ahead > 0) & (ahead <= horizon)).astype(np.int8)
    return y, ahead > 0
