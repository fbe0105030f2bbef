"""<KEEP>: what a healthy checkpoint holds (the guard's state among it: :func:`guard_state`),
and which checkpoint a resume starts from.

The ring itself (atomic writes, verification, averaging) is ``checkpoints.py``.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from collapse_guard.guard.checkpoints import CheckpointRing, CorruptCheckpoint, load_verified
from collapse_guard.guard.state import STATE_VERSION, RunState, Training, Trajectory

__all__ = [
    "RECORDED_LOSS_STEPS",
    "checkpoint_state",
    "load_resume",
    "resume_point",
    "save_checkpoint",
]

RECORDED_LOSS_STEPS = 20  # a checkpoint's recorded loss: the mean of this many last losses
# (the label's smoothing time constant is 10 steps: 20 averages out a step's noise)


def checkpoint_state(
    training: Training, guard: dict[str, Any], losses: Iterable[float]
) -> dict[str, Any]:
    """A checkpoint's dict: the training state, the guard's, and the recorded loss (the
    ring's basin test, checkpoints.py, reads it from the sidecar)."""
    recent = list(losses)[-RECORDED_LOSS_STEPS:]
    return {
        **training.state(),
        "guard": guard,
        "loss": sum(recent) / len(recent) if recent else math.nan,
    }


def resume_point(
    ring: CheckpointRing, path: str | os.PathLike | None, tidy: bool
) -> tuple[Path, dict[str, Any]]:
    """The checkpoint a resume loads and its state: ``path``, or the ring's newest valid
    one (``tidy``: damaged newer ones renamed ``*.corrupt``, said in one warning)."""
    if path is not None:
        return Path(path), load_verified(path)  # the one asked for, or an error naming it
    found, state, skipped = ring.newest_valid(tidy=tidy)
    if skipped:
        warnings.warn(
            f"collapse-guard resume: skipped {len(skipped)} damaged checkpoint(s) in "
            f"{ring.folder} (renamed *.corrupt): {'; '.join(skipped)}; resuming from "
            f"{found.name if found else 'none'}",
            RuntimeWarning,
            stacklevel=4,  # the loop's call of Guard.resume
        )
    if found is None and skipped:
        raise CorruptCheckpoint(
            f"no valid guard checkpoint in {ring.folder} to resume from (skipped: "
            f"{'; '.join(skipped)})",
            "start the run afresh, or point checkpoint_dir at the run's folder",
        )
    if found is None:
        raise FileNotFoundError(f"no guard checkpoint in {ring.folder} to resume from")
    return found, state


def save_checkpoint(
    ring: CheckpointRing,
    writer: Any,
    step: int,
    training: Training,
    guard: dict[str, Any],
    losses: Iterable[float],
) -> None:
    """A healthy checkpoint of the state after step ``step - 1`` into the ring; the run
    file's rows up to it are made durable first."""
    if writer is not None:
        writer.flush()
    ring.save(step, checkpoint_state(training, guard, losses))


def load_resume(
    ring: CheckpointRing, training: Training, path: str | os.PathLike | None, tidy: bool
) -> tuple[Path, dict[str, Any]]:
    """:func:`resume_point`, adopted by the ring (its lineage) and loaded into training."""
    path, state = resume_point(ring, path, tidy)
    ring.adopt(path, tidy=tidy)
    training.load(state)
    return path, state


def guard_state(run: RunState, trajectory: Trajectory, hold: Any, run_id: str) -> dict[str, Any]:
    """``Guard.state_dict()``: the run's kept fields (with the run file's id, which a
    resumed run continues, and the risk hold: a warning held before resuming holds on)
    and the trajectory."""
    kept_run = {**run.state_dict(), "run_id": run_id, "risk_hold": hold.state_dict()}
    return {"version": STATE_VERSION, "run": kept_run, "trajectory": trajectory.state_dict()}


def load_guard_state(
    state: Mapping[str, Any], run: RunState, trajectory: Trajectory, hold: Any
) -> None:
    """Restore :func:`guard_state` into ``run``, ``trajectory`` and ``hold``."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"guard state version {state.get('version')!r}, this code reads "
            f"{STATE_VERSION}; resume with the collapse-guard release that saved it"
        )
    run.load_state_dict(state["run"])
    if "risk_hold" in state["run"]:  # absent in checkpoints saved before the hold
        hold.load_state_dict(state["run"]["risk_hold"])
    trajectory.load_state_dict(state["trajectory"])
