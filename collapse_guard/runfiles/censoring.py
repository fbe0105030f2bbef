"""Guarded runs as training data: what the guard changed is no evidence of what the run would do.

A run the guard watched is natural up to the guard's first intervention (a skipped update,
a lower LR, clipped layers, a rescue: every event of the run file's ``event`` column but
``checkpoint``, which leaves training as it was). After it, the run shows what the guard
made of it, not what it would have done: a collapse the guard averted looks like a healthy
run, and labelling those rows healthy would teach the predictor that the warning signs it
raised the alarm on lead nowhere. So the rows whose outcome depends on the steps after the
first intervention are censored, neither healthy nor collapsing:

1. the label is set from the steps before the first intervention ``c`` only;
2. a collapse found there (onset before ``c``) is a collapse as any other: the steps before
   ``c`` are kept with that onset. So is a collapse that the whole run's label finds
   starting before ``c``: it began before the guard acted and stayed despite it;
3. otherwise a row at step ``t`` is healthy only if its horizon ``(t, t + H]`` ends before
   anything the label could not yet see: ``t + H < c - tail``, where ``tail`` is the label's
   ``tail_min_steps`` (an excursion younger than that at ``c`` is not called a collapse by
   the label, yet may have been one). Later rows are dropped: censored.

>>> frame, meta, censoring = censor_guarded(frame, meta)   # a labelled, censored copy
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.label import HORIZON, LabelRule, apply_label, label_run

__all__ = ["NOT_INTERVENTIONS", "Censoring", "censor_guarded", "first_intervention"]

# Guard events that leave the training trajectory as it was (decision.py's event table).
NOT_INTERVENTIONS = frozenset({"checkpoint"})


@dataclass(frozen=True)
class Censoring:
    """What :func:`censor_guarded` did to one run."""

    first_intervention: int | None  # step of the guard's first intervention; None: none
    kept_until: int | None  # last step kept; None: every step (no intervention)
    rows_before: int
    rows_kept: int

    @property
    def censored(self) -> bool:
        return self.rows_kept < self.rows_before

    def to_dict(self) -> dict:
        return {
            "first_intervention": self.first_intervention,
            "kept_until": self.kept_until,
            "rows_before": self.rows_before,
            "rows_kept": self.rows_kept,
        }


def _intervenes(event: str) -> bool:
    # "skip:loss_z=7.1;checkpoint" -> kinds "skip", "checkpoint"; "lr_x0.5" has no colon
    return any(
        token.split(":", 1)[0] not in NOT_INTERVENTIONS for token in event.split(";") if token
    )


def first_intervention(frame: pd.DataFrame) -> int | None:
    """Step of the first row whose ``event`` holds an intervention, or None."""
    for step, event in zip(frame["step"], frame["event"], strict=True):
        if _intervenes(event):
            return int(step)
    return None


def censor_guarded(
    frame: pd.DataFrame,
    meta: RunMeta,
    *,
    horizon: int = HORIZON,
    rule: LabelRule | None = None,
) -> tuple[pd.DataFrame, RunMeta, Censoring]:
    """A labelled copy of a guarded run that keeps only rows with a known outcome.

    Returns ``(frame, meta, censoring)``: ``meta`` carries the label of the kept steps and
    ``extra["censoring"]`` (:class:`Censoring` as a dict). A run without intervention is
    labelled whole and kept whole.
    """
    rule = rule or LabelRule()
    c = first_intervention(frame)
    steps = frame["step"].to_numpy()
    natural = frame if c is None else frame[steps < c]
    label = label_run(natural)
    if c is not None and label.onset_step is None:
        whole = label_run(frame)  # rule 2's second case: under way before the guard acted
        if whole.onset_step is not None and whole.onset_step < c:
            label = whole
    if c is None or label.onset_step is not None:
        kept, until = natural, (None if c is None else int(steps[steps < c].max(initial=-1)))
    else:
        # rule 3: t + H < c - tail, i.e. t <= c - tail - H - 1
        until = c - rule.tail_min_steps - horizon - 1
        kept = frame[steps <= until]
    censoring = Censoring(c, until, len(frame), len(kept))
    labelled = apply_label(meta, label)  # an onset found is before c, so among the kept steps
    extra = {**labelled.extra, "censoring": censoring.to_dict()}
    return kept.reset_index(drop=True), replace(labelled, extra=extra), censoring
