"""A rollback across a change of the optimizer's parameter groups.

A loop may add groups as it trains (``optimizer.add_param_group``: progressive unfreezing, a
new head); a rescue may then roll back to a checkpoint written before, whose optimizer state
has fewer groups, and torch's ``load_state_dict`` refuses it. The weights roll back all the
same (the model's parameters are the same tensors); of the optimizer's state, the groups
the checkpoint had take theirs and the groups added since start afresh, as they did when
added. A layout that changed otherwise (a group's size) keeps no state at all: a fresh
optimizer state at the rolled-back weights, rather than a crash of the user's loop.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_across_groups"]

GROWN = (
    "collapse-guard: the optimizer has more parameter groups than at the checkpoint rolled "
    "back to (optimizer.add_param_group since); the groups it had take the checkpoint's "
    "state, those added since start afresh (said once)"
)
RESET = (
    "collapse-guard: the checkpoint's optimizer state does not fit the optimizer's groups "
    "now ({error}); the weights roll back and the optimizer's state starts afresh (its "
    "momenta and second moments); change the groups by add_param_group only, or keep them "
    "fixed, to keep the state through a rollback (said once)"
)


def _grown(saved: dict, current: dict) -> dict | None:
    """``saved`` with the groups ``current`` added after it, when that is the only change."""
    old, new = saved.get("param_groups"), current.get("param_groups")
    if not old or not new or len(old) >= len(new):
        return None
    if any(len(a["params"]) != len(b["params"]) for a, b in zip(old, new, strict=False)):
        return None
    # torch pairs the saved ids with the optimizer's parameters by position: the old groups
    # number their parameters first in both, so the added groups' ids follow on unique
    return {"state": saved.get("state", {}), "param_groups": [*old, *new[len(old) :]]}


def load_across_groups(optimizer: Any, saved: dict) -> str:
    """Load ``saved`` into ``optimizer`` as a rollback does; returns what could not be kept
    as it was, for a warning ('' when the layout is the checkpoint's)."""
    try:
        optimizer.load_state_dict(saved)
        return ""
    except ValueError as error:
        current = optimizer.state_dict()
        grown = _grown(saved, current)
        if grown is not None:
            optimizer.load_state_dict(grown)
            return GROWN
        if "state" not in current:  # not torch's layout: nothing this module can mend
            raise
        optimizer.load_state_dict({**current, "state": {}})
        return RESET.format(error=error)
