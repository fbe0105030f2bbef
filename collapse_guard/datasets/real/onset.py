"""How soon a collapse follows its trigger: ``sudden`` or ``develops``, decided in one place.

A trigger is a step where an intervention began (``RealRunConfig.triggers``: step 0,
a re-warm's start, a fault's first step). A collapse's trigger is the latest one at
or before its onset. When the onset comes less than ``SUDDEN_WITHIN`` steps after it,
the collapse is ``sudden``: no forecast can precede it by the evaluation's minimum
lead (``runfiles.label.MIN_LEAD``: an alarm counts only when it comes at least that many
steps before onset), so it belongs to the guard's reactive path. Otherwise it ``develops``.
"""

from __future__ import annotations

from collections.abc import Iterable

from collapse_guard.runfiles.label import MIN_LEAD

__all__ = ["SUDDEN_WITHIN", "onset_kind"]

SUDDEN_WITHIN = MIN_LEAD  # steps: no forecast can come earlier than the minimum lead


def onset_kind(triggers: Iterable[int], onset: int | None) -> tuple[str | None, int | None]:
    """``(kind, steps from the trigger to the onset)``; ``(None, None)`` for a healthy run.

    Triggers after the onset do not count (a fault that came after the collapse did not
    cause it). Without any trigger at or before the onset, the distance is counted from
    step 0, where training began.
    """
    if onset is None:
        return None, None
    latest = max((t for t in triggers if t <= onset), default=0)
    gap = onset - latest
    return ("sudden" if gap < SUDDEN_WITHIN else "develops"), gap
