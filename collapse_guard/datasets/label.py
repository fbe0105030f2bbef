"""The collapse label: where a run stops learning and does not come back.

One versioned rule (DESIGN.md "Collapse: the label"), applied to every run from
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
6. Excursions cannot start in the first ``settle_steps`` steps (the EWMA starts
   from one noisy value, and the first optimizer steps often overshoot before the
   loss falls). Non-finite losses count from the first step.

Targets for training (``collapse_targets``): at step t, y = 1 when the onset lies in
(t, t + horizon]; rows at and after the onset are not prediction rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from collapse_guard.datasets.runfile import RunMeta

__all__ = [
    "COLLAPSE_KINDS",
    "HORIZON",
    "LABEL_VERSION",
    "Label",
    "LabelRule",
    "Spike",
    "apply_label",
    "collapse_targets",
    "label_run",
]

# Bump on any change of the rule or of a LabelRule default: stored labels name it.
LABEL_VERSION: str = "1"
HORIZON: int = 200  # DESIGN.md: predict collapse within the next 200 steps
COLLAPSE_KINDS: tuple[str, ...] = ("nonfinite", "loss_rise", "grad_collapse")


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
    # No excursion may start this soon after the first measured loss: 3 EWMA time
    # constants for the average to forget its single-value start; the first optimizer
    # steps often overshoot (modded-nanogpt: 11.0 -> 11.0 before falling).
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
    loss = pd.to_numeric(frame["loss"], errors="coerce").to_numpy(dtype=np.float64)
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


# --------------------------------------------------------------------------- excursions


@dataclass
class _Excursion:
    start: int  # first step above the margin (or first non-finite step)
    back: float  # best + recover_frac * margin at the start: at or below it = recovered
    best: float
    peak_step: int
    peak: float
    rows: int = 1
    nonfinite: bool = False


@dataclass
class _Outcome:
    onset: int | None = None
    kind: str | None = None
    confirmed: int | None = None
    spikes: list[Spike] = field(default_factory=list)


class _Scanner:
    """One forward pass over the trace: smooth, track the best level, find excursions."""

    def __init__(self, trace: _Trace, rule: LabelRule) -> None:
        self.t, self.rule = trace, rule
        measured = np.isfinite(trace.loss) | trace.nonfinite
        self.first_step = int(trace.steps[measured][0]) if measured.any() else 0
        self.smooth: float | None = None  # EWMA of the finite loss
        self.smooth_step = 0
        self.best = math.inf
        self.exc: _Excursion | None = None
        self.out = _Outcome()

    def run(self) -> _Outcome:
        t = self.t
        for i in range(len(t.steps)):
            step = int(t.steps[i])
            if self.exc is not None and step - self.exc.start > self._window():
                return self._collapse(confirmed=step)
            if t.nonfinite[i]:
                self._on_nonfinite(step)
            elif np.isfinite(t.loss[i]):
                self._on_loss(step, float(t.loss[i]))
        return self._at_end()

    def _window(self) -> float:
        return self.rule.window(self.exc.start, self.first_step)

    def _on_nonfinite(self, step: int) -> None:
        if self.exc is None:
            self.exc = _Excursion(step, self._back_line(), self.best, step, math.inf)
        elif not self.exc.nonfinite:
            self.exc.peak_step, self.exc.peak = step, math.inf
        else:
            self.exc.rows += 1
        self.exc.nonfinite = True
        self.smooth = None  # the EWMA restarts from the next finite loss

    def _on_loss(self, step: int, loss: float) -> None:
        value = self._smooth(step, loss)
        exc = self.exc
        if exc is not None:
            if value <= exc.back:
                self._recovered(step)
            else:
                exc.rows += 1
                if loss > exc.peak:
                    exc.peak_step, exc.peak = step, loss
                return
        if self.exc is None:
            margin = self.rule.margin(self.best)
            settled = step - self.first_step >= self.rule.settle_steps
            if settled and math.isfinite(self.best) and value > self.best + margin:
                self.exc = _Excursion(step, self._back_line(), self.best, step, loss)
            else:
                self.best = min(self.best, value)

    def _back_line(self) -> float:
        """Level the smoothed loss must come back to for the run to have recovered."""
        if not math.isfinite(self.best):  # nothing learned yet: any finite loss will do
            return math.inf
        return self.best + self.rule.recover_frac * self.rule.margin(self.best)

    def _smooth(self, step: int, loss: float) -> float:
        if self.smooth is None:
            self.smooth = loss
        else:
            a = 1.0 - math.exp(-(step - self.smooth_step) / self.rule.smooth_steps)
            a = min(a, self.rule.max_row_weight)
            self.smooth += a * (loss - self.smooth)
        self.smooth_step = step
        return self.smooth

    def _recovered(self, step: int) -> None:
        exc = self.exc
        height = exc.peak - exc.best if math.isfinite(exc.best) else math.inf
        self.out.spikes.append(Spike(exc.start, exc.peak_step, step, float(height)))
        self.exc = None

    def _collapse(self, confirmed: int) -> _Outcome:
        exc = self.exc
        kind = "nonfinite" if exc.nonfinite else "loss_rise"
        self.out.onset, self.out.kind, self.out.confirmed = exc.start, kind, confirmed
        return self.out

    def _at_end(self) -> _Outcome:
        exc = self.exc
        if exc is None:
            return self.out
        last = int(self.t.steps[-1])
        lasted = last - exc.start >= self.rule.tail_min_steps
        if exc.nonfinite or (lasted and exc.rows >= self.rule.tail_min_rows):
            return self._collapse(confirmed=last)
        return self.out  # too short to say: neither a collapse nor a finished spike


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
