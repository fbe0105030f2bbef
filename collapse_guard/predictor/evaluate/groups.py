"""What a run is grouped by in the report: its collapse, and the set-up it was trained with.

Collapse groupings count collapsing runs only (issue 4: "say which collapse kinds are
missed"; a false alarm belongs to a threshold, not to a kind):

==========  ===============================================================================
grouping    value
==========  ===============================================================================
``kind``    the label's ``extra["collapse_kind"]`` (``nonfinite``, ``loss_rise``, ...)
``cause``   the generator's account: real runs' ``extra["collapse_cause"]``, synthetic
            runs' ``extra["synthetic_kind"]``
``onset``   ``extra["onset_kind"]``: ``sudden`` (onset < 10 steps after its trigger: the
            guard's reactive path) or ``develops``; ``unknown`` where a run does not say
            (then nothing is derived, and sudden and developing collapses are reported
            together)
==========  ===============================================================================

Set-up groupings count every run, healthy ones too (false alarms per family matter):

=============  ============================================================================
``family``     the model family, ``config["family"]`` (``gpt``, ``rope_swiglu``, ``mha``);
               a real or guarded run without one is ``gpt`` (the only family before the
               key existed); synthetic runs are ``synthetic``; imported runs are their
               source, ``imported``
``optimizer``  ``config["optimizer"]``; ``unknown`` where absent
``data``       ``config["data"]``; ``unknown`` where absent
=============  ============================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from collapse_guard.predictor.evaluate.events import (
    MIN_LEAD,
    EventResult,
    ScoredRun,
    event_metrics,
)
from collapse_guard.runfiles.label import HORIZON

__all__ = [
    "COLLAPSE_GROUPINGS",
    "DEFAULT_FAMILY",
    "GROUPINGS",
    "NEVER_HELD_OUT",
    "SETUP_GROUPINGS",
    "SYNTHETIC_FAMILY",
    "UNKNOWN",
    "GroupResult",
    "cause_of",
    "group_metrics",
    "held_out_group",
    "kind_of",
    "run_groups",
    "setup_of",
]

COLLAPSE_GROUPINGS = ("kind", "cause", "onset")
SETUP_GROUPINGS = ("family", "optimizer", "data")
GROUPINGS = COLLAPSE_GROUPINGS + SETUP_GROUPINGS
UNKNOWN = "unknown"  # a run whose metadata names no value for a grouping
DEFAULT_FAMILY = "gpt"  # real runs made before config["family"] existed: nanoGPT-shaped
SYNTHETIC_FAMILY = "synthetic"
NEVER_HELD_OUT = (SYNTHETIC_FAMILY, UNKNOWN)  # groups that are training data, never a test


def kind_of(meta) -> str | None:
    """The label's kind of a collapsing run (``extra["collapse_kind"]``); None if healthy."""
    if meta.onset_step is None:
        return None
    return meta.extra.get("collapse_kind") or UNKNOWN


def cause_of(meta) -> str | None:
    """The generator's cause of a collapse (``collapse_cause``, else ``synthetic_kind``)."""
    if meta.onset_step is None:
        return None
    return meta.extra.get("collapse_cause") or meta.extra.get("synthetic_kind") or UNKNOWN


def _onset_of(meta) -> str | None:
    if meta.onset_step is None:
        return None
    return meta.extra.get("onset_kind") or UNKNOWN


def setup_of(meta, grouping: str) -> str:
    """A run's ``family``, ``optimizer`` or ``data`` (module docstring)."""
    if grouping == "family":
        if meta.source == "synthetic":
            return SYNTHETIC_FAMILY
        if meta.source == "imported":
            return meta.source
        return str(meta.config.get("family") or DEFAULT_FAMILY)
    if grouping in SETUP_GROUPINGS:
        return str(meta.config.get(grouping) or UNKNOWN)
    raise ValueError(f"grouping must be one of {SETUP_GROUPINGS}, got {grouping!r}")


def held_out_group(meta, grouping: str) -> str:
    """The group a leave-one-out puts a run in: its set-up, but ``synthetic`` for every
    synthetic run, whatever its config says (synthetic runs are training data, never a test)."""
    return SYNTHETIC_FAMILY if meta.source == "synthetic" else setup_of(meta, grouping)


def run_groups(meta) -> dict[str, str | None]:
    """Every grouping of one run (``ScoredRun.groups``); collapse groupings None if healthy."""
    return {
        "kind": kind_of(meta),
        "cause": cause_of(meta),
        "onset": _onset_of(meta),
        **{g: setup_of(meta, g) for g in SETUP_GROUPINGS},
    }


@dataclass(frozen=True)
class GroupResult:
    """Event metrics over the runs of one group (collapsing runs only for a collapse grouping)."""

    grouping: str
    group: str
    events: EventResult


def group_metrics(
    runs: Sequence[ScoredRun],
    threshold: float,
    *,
    by: str = "kind",
    horizon: int = HORIZON,
    min_lead: int = MIN_LEAD,
) -> list[GroupResult]:
    """Event metrics per group of ``by`` (one of GROUPINGS), sorted by group, at ``threshold``."""
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {GROUPINGS}, got {by!r}")
    members: dict[str, list[ScoredRun]] = {}
    for run in runs:
        if by in COLLAPSE_GROUPINGS and not run.collapsed:
            continue
        members.setdefault(run.groups.get(by) or UNKNOWN, []).append(run)
    kwargs = {"horizon": horizon, "min_lead": min_lead}
    return [
        GroupResult(by, group, event_metrics(members[group], threshold, **kwargs))
        for group in sorted(members)
    ]
