"""Guarded runs as training data: which rows keep a known outcome, and what a rescue says.

The guard acts on a run in three ways, and each says something different about the outcome
the run would have had unguarded (measured by replaying the same seeds with and without
each action: ``benchmarks/guard_label_effect.py``, figures in benchmarks/README.md):

==========================  =================================================================
event kinds                 what they leave known
==========================  =================================================================
``checkpoint``,             everything: training goes on as it was. So do the actions that
``checkpoint_refused``,     touch one step or one head: a z-score skip (``skip:loss_z=..``,
``skip:loss_z|grad_z``,     ``skip:grad_z=..``) drops one batch of a few hundred, an
``accept``, ``qk_clip``     ``accept`` applies an outlier clipped as the loop itself clips,
                            a ``qk_clip`` scales one head's W_q, W_k by sqrt(tau / S) when its
                            logits pass tau (100). Replayed, none of them changed a run's
                            label, and none moved an onset by more than the label's own
                            smoothing: they are no intervention (:data:`OUTCOME_KEPT`)
``rescue``, ``give_up``     an outcome: a collapse that developed (or a non-finite loss)
                            and was caught. The rows up to the rescue are a collapsing run;
                            its onset is the label's rule on them, the excursion open at
                            the rescue counted however young (:func:`rescue_label`); with
                            none open (a rescue of outliers after an LR jump), the rescue's
                            own step. Rows after it are another trajectory: dropped
everything else             an intervention: a level's LR change (``lr_x``), warn's LR hold
                            (``lr_hold``), a per-layer clip (``clip_layers``), a skipped
                            non-finite gradient (which unguarded is a NaN update): they
                            exist to avert a collapse, so
                            the rows whose outcome depends on the steps after them are
                            censored, as below; so is the loop's ``data_changed``
                            (``Guard.data_changed``): the loss jumps with the new data,
                            which the label's rule would read as an onset
==========================  =================================================================

Without a rescue, the first intervention ``c`` censors:

1. the label is set from the steps before ``c`` only;
2. a collapse found there (onset before ``c``) is a collapse as any other: the steps before
   ``c`` are kept with that onset. So is a collapse that the whole run's label finds
   starting before ``c``: it began before the guard acted and stayed despite it;
3. otherwise a row at step ``t`` is healthy only if its horizon ``(t, t + H]`` ends before
   anything the label could not yet see: ``t + H < c - tail``, where ``tail`` is the label's
   ``tail_min_steps`` (an excursion younger than that at ``c`` is not called a collapse by
   the label, yet may have been one). Later rows are dropped: censored.

A rescue after an intervention ``c`` is still a collapse: the guard's actions did not avert
it. But an LR change before the onset ``o`` delays it (replayed: by 53-57 steps, against
8-14 for the actions above), so a row's target on the guarded run (collapse within H of
``o``) is not the one the run would have had. Rows whose target the delay cannot move are
kept: ``t + H < c - tail`` (healthy, as rule 3) and ``t >= o - H`` (within H of an onset no
earlier than the run's own), up to the rescue; the rows between are dropped. An
intervention at or after ``o`` came when the collapse was under way: every row is kept.

>>> frame, meta, censoring = censor_guarded(frame, meta)   # a labelled, censored copy
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.label import HORIZON, Label, LabelRule, apply_label, label_run

__all__ = [
    "OUTCOME_KEPT",
    "RESCUES",
    "Censoring",
    "censor_guarded",
    "first_intervention",
    "first_rescue",
    "rescue_label",
]

# Event kinds after which the run's outcome is the one it would have had unguarded
# (module docstring; benchmarks/guard_label_effect.py). ``skip`` only for z-score skips.
OUTCOME_KEPT = frozenset({"checkpoint", "checkpoint_refused", "accept", "qk_clip"})
_KEPT_SKIPS = ("loss_z", "grad_z")  # skip reasons of one outlier batch
RESCUES = frozenset({"rescue", "give_up"})  # the guard caught a collapse: an outcome


@dataclass(frozen=True)
class Censoring:
    """What :func:`censor_guarded` did to one run."""

    first_intervention: int | None  # step of the guard's first intervention; None: none
    kept_until: int | None  # last step kept; None: every step (no intervention)
    rows_before: int
    rows_kept: int
    rescue: int | None = None  # step of the first rescue: the run is a caught collapse

    @property
    def censored(self) -> bool:
        return self.rows_kept < self.rows_before

    def to_dict(self) -> dict:
        return {
            "first_intervention": self.first_intervention,
            "kept_until": self.kept_until,
            "rows_before": self.rows_before,
            "rows_kept": self.rows_kept,
            "rescue": self.rescue,
        }


def _kinds(event: str) -> list[tuple[str, str]]:
    # "skip:loss_z=7.1;checkpoint" -> ("skip", "loss_z=7.1"), ("checkpoint", "")
    return [
        tuple(token.split(":", 1)) if ":" in token else (token, "")
        for token in event.split(";")
        if token
    ]


def _intervenes(kind: str, reason: str) -> bool:
    if kind == "skip":
        return not reason.startswith(_KEPT_SKIPS)
    return kind not in OUTCOME_KEPT and kind not in RESCUES


def _first(frame: pd.DataFrame, hit) -> int | None:
    for step, event in zip(frame["step"], frame["event"], strict=True):
        if any(hit(kind, reason) for kind, reason in _kinds(event)):
            return int(step)
    return None


def first_intervention(frame: pd.DataFrame) -> int | None:
    """Step of the first row whose ``event`` holds an intervention (no rescue), or None."""
    return _first(frame, _intervenes)


def first_rescue(frame: pd.DataFrame) -> int | None:
    """Step of the first row whose ``event`` holds a rescue (or the guard giving up)."""
    return _first(frame, lambda kind, _: kind in RESCUES)


def rescue_label(frame: pd.DataFrame, rescue: int, rule: LabelRule | None = None) -> Label:
    """The collapse a rescue at step ``rescue`` caught, from the rows up to it.

    The label's rule with its tail condition lifted: the guard rescues an excursion after
    ``collapse_confirm_steps`` (30), younger than the label's ``tail_min_steps`` (50), so
    the plain rule would call the rows before it healthy. The onset is the start of the
    excursion open at the rescue (the guard's online label reads the same EWMA and margin,
    so it is the excursion the guard saw), or the rescue's own step when none is open.
    """
    rule = rule or LabelRule()
    lifted = replace(rule, tail_min_steps=0, tail_min_rows=1)
    label = label_run(frame[frame["step"] <= rescue], lifted)
    if label.onset_step is not None:
        return label
    return Label(onset_step=rescue, kind="rescued", spikes=label.spikes)


def _rescued_rows(steps, c: int | None, rescue: int, onset: int, horizon: int, rule: LabelRule):
    """The rows of a rescued run that are kept: up to the rescue, less those whose target an
    intervention before the onset could have moved (module docstring, "A rescue after")."""
    kept = steps <= rescue
    if c is None or c >= onset:
        return kept
    healthy = steps < c - rule.tail_min_steps - horizon  # as rule 3: known whatever followed
    doomed = steps >= onset - horizon  # within H of an onset no earlier than the run's own
    return kept & (healthy | doomed)


def _natural_label(frame: pd.DataFrame, c: int | None) -> Label:
    """Rules 1 and 2 of the module docstring."""
    steps = frame["step"].to_numpy()
    label = label_run(frame if c is None else frame[steps < c])
    if c is not None and label.onset_step is None:
        whole = label_run(frame)  # rule 2's second case: under way before the guard acted
        if whole.onset_step is not None and whole.onset_step < c:
            return whole
    return label


def censor_guarded(
    frame: pd.DataFrame,
    meta: RunMeta,
    *,
    horizon: int = HORIZON,
    rule: LabelRule | None = None,
) -> tuple[pd.DataFrame, RunMeta, Censoring]:
    """A labelled copy of a guarded run that keeps only rows with a known outcome.

    Returns ``(frame, meta, censoring)``: ``meta`` carries the label of the kept steps and
    ``extra["censoring"]`` (:class:`Censoring` as a dict). A run without intervention or
    rescue is labelled whole and kept whole; a rescued one is a collapse (module docstring).
    """
    rule = rule or LabelRule()
    c, rescue = first_intervention(frame), first_rescue(frame)
    steps = frame["step"].to_numpy()
    if rescue is not None:
        label = rescue_label(frame, rescue, rule)
        kept, until = (
            frame[_rescued_rows(steps, c, rescue, label.onset_step, horizon, rule)],
            rescue,
        )
    else:
        label = _natural_label(frame, c)
        if c is None:
            kept, until = frame, None
        elif label.onset_step is not None:
            kept, until = frame[steps < c], int(steps[steps < c].max(initial=-1))
        else:  # rule 3: t + H < c - tail, i.e. t <= c - tail - H - 1
            until = c - rule.tail_min_steps - horizon - 1
            kept = frame[steps <= until]
    censoring = Censoring(c, until, len(frame), len(kept), rescue)
    labelled = apply_label(meta, label)  # the onset found is among the kept steps
    extra = {**labelled.extra, "censoring": censoring.to_dict()}
    if rescue is not None:
        extra["rescue"] = {
            "step": rescue,
            "onset_from": "trigger" if label.kind == "rescued" else "label",
        }
    return kept.reset_index(drop=True), replace(labelled, extra=extra), censoring
