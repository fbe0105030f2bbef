"""<RECORD>'s bookkeeping: what a step's outcome does to the counts, streaks, outlier
histories and the risk window (before a rescue, which then replaces the trajectory)."""

from __future__ import annotations

from collapse_guard.guard.decision import GuardDecision
from collapse_guard.guard.state import RunState, Trajectory
from collapse_guard.predictor.core.levels import CRITICAL
from collapse_guard.signals import SIGNAL_NAMES

__all__ = ["tally"]


def tally(
    decision: GuardDecision, record: dict[str, float], run: RunState, trajectory: Trajectory
) -> None:
    """Count step ``run.step_index`` (its ``record``: the probe's row)."""
    s = run.step_index
    applied = decision.apply_update and not decision.rescue
    if applied:
        run.skip_streak = 0
        trajectory.loss_history.add(record["loss"])
        trajectory.grad_history.add(record["grad_norm"])
        if run.data_fault:  # the online label sees only the batches trained on
            trajectory.online.update(s, record["loss"])
    elif not decision.rescue:
        run.skip_streak += 1
        run.skipped += 1
    run.clean_steps = run.clean_steps + 1 if run.data_fault and applied else 0
    run.data_fault = decision.data_fault
    open_excursion = trajectory.online.open_for(s) > 0
    calm = applied and not open_excursion and decision.level != CRITICAL
    run.quiet_steps = run.quiet_steps + 1 if calm else 0
    if not decision.rescue:
        trajectory.window.append(s, [record[k] for k in SIGNAL_NAMES])
        if trajectory.context is not None:
            trajectory.context.update(s, record)
