"""The guard's numbers where people already look: trainer logs, MLflow, TensorBoard.

:func:`guard_metrics` turns a guard's state into a flat dict of scalars whose names never
change (a chart or a column per name):

==========================  =========================================================
name                        value
==========================  =========================================================
``guard/risk``              P(collapse) in force (held); absent before the first reading
                            and with ``risk="off"``
``guard/level``             the level in force as a number: ok 0, watch 1, warn 2,
                            critical 3
``guard/lr_scale``          the factor on the loop's LR now: the level's multiplier
                            under the rescues' cap and the warn's hold (1.0: the
                            loop's own LR)
``guard/actions/skip``      updates skipped so far (``guard.summary()["skipped"]``)
``guard/actions/rescue``    rescues so far (``"rescues"``)
``guard/actions/checkpoint``  healthy checkpoints written (``"checkpoints"``)
``guard/actions/qk_clip``   attention heads QK-clipped (``"qk_clips"``)
==========================  =========================================================

:class:`Trackers` sends them on: ``"mlflow"`` (the active MLflow run, when there is
one), a TensorBoard ``SummaryWriter`` (anything with ``add_scalar``), or any callable
``(metrics, step)``. The step is the number of optimizer steps done, the Trainer's
``global_step``. A tracker that raises is named in one warning and dropped: logging
never stops training. The integrations add the same dict to the Trainer's logs
(transformers) and to ``self.log`` (Lightning, every logger).
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from collapse_guard.errors import UserInputError

__all__ = ["PREFIX", "TrackerSpec", "Trackers", "guard_metrics", "log_to_mlflow"]

PREFIX = "guard/"
# action name -> its count in guard.summary()
_ACTIONS = {
    "skip": "skipped",
    "rescue": "rescues",
    "checkpoint": "checkpoints",
    "qk_clip": "qk_clips",
}

Send = Callable[[Mapping[str, float], int], Any]
TrackerSpec = Any  # "mlflow", a SummaryWriter, a callable (metrics, step), a list, None


def guard_metrics(guard: Any) -> dict[str, float]:
    """The guard's risk, level, LR scale and action counts (module docstring), now."""
    run, summary = guard.run, guard.summary()
    metrics = {}
    if math.isfinite(run.probability):
        metrics[f"{PREFIX}risk"] = float(run.probability)
    metrics[f"{PREFIX}level"] = float(run.level.rank)  # a Level: ok 0 .. critical 3
    metrics[f"{PREFIX}lr_scale"] = _lr_scale(run, summary.get("lr_hold", math.inf))
    for action, key in _ACTIONS.items():
        metrics[f"{PREFIX}actions/{action}"] = float(summary[key])
    return metrics


def _lr_scale(run: Any, hold: float) -> float:
    """The level's multiplier, or less where the rescues' cap or the warn's hold (its
    ceiling: ``hold``) binds at the loop's LR."""
    loop_lr, ceiling = (run.loop_lrs[-1] if run.loop_lrs else 0.0), min(run.lr_cap(), hold)
    if loop_lr > 0 and loop_lr * run.lr_multiplier > ceiling:
        return float(ceiling / loop_lr)
    return float(run.lr_multiplier)


def log_to_mlflow(metrics: Mapping[str, float], step: int) -> None:
    """Log into the active MLflow run; nothing without one (no run is started)."""
    mlflow = sys.modules.get("mlflow")  # a run can be active only where mlflow is imported:
    if mlflow is not None and mlflow.active_run() is not None:  # never import it here
        mlflow.log_metrics(dict(metrics), step=step)


class _ScalarWriter:
    """A TensorBoard ``SummaryWriter`` (or tensorboardX's, or any ``add_scalar``)."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def __call__(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)


_NAMED = {"mlflow": log_to_mlflow}
_EXPECTED = (
    '"mlflow" (the active MLflow run), a TensorBoard SummaryWriter (anything with '
    "add_scalar), or a callable (metrics, step)"
)


def _tracker(spec: Any) -> tuple[str, Send]:
    """A tracker's name (for the warning that drops it) and its send."""
    if isinstance(spec, str):
        if spec not in _NAMED:
            raise UserInputError(
                f"trackers: unknown tracker {spec!r}", f"the named ones are {sorted(_NAMED)}"
            )
        return spec, _NAMED[spec]
    if hasattr(spec, "add_scalar"):
        return type(spec).__name__, _ScalarWriter(spec)
    if callable(spec):
        return getattr(spec, "__qualname__", type(spec).__name__), spec
    raise UserInputError(
        f"trackers: got {spec!r} ({type(spec).__name__})",
        f"pass {_EXPECTED}, or a list of them",
    )


def _trackers(spec: TrackerSpec) -> list[tuple[str, Send]]:
    """The spec as a list: None is ``["mlflow"]``, one tracker a list of one."""
    if spec is None:
        spec = ["mlflow"]
    elif isinstance(spec, str) or hasattr(spec, "add_scalar") or callable(spec):
        spec = [spec]
    elif not isinstance(spec, Iterable):
        raise UserInputError(f"trackers: got {spec!r} ({type(spec).__name__})", f"pass {_EXPECTED}")
    return [_tracker(one) for one in spec]


class Trackers:
    """Where :func:`guard_metrics` goes, every ``every`` steps, from DDP's rank 0 alone.

    >>> trackers = Trackers(["mlflow", SummaryWriter("tb")])   # or Trackers(): MLflow
    >>> decision = guard.step(loss)
    >>> trackers.log(guard)                    # sends at steps 10, 20, ... (``every``)

    Args:
        spec: ``"mlflow"``, a ``SummaryWriter``, a callable ``(metrics, step)``, or a list
            of them; None (the default) is ``["mlflow"]``: the active MLflow run, if any
            (a user who started a run looks there; without one nothing is sent); ``[]``:
            nowhere.
        every: steps between two logs; the guard's risk changes every
            ``GuardPolicy.risk_every`` (10) steps.
    """

    def __init__(self, spec: TrackerSpec = None, every: int = 10) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise UserInputError(
                f"trackers: every must be a whole number of steps >= 1, got {every!r}",
                "log every 10 steps, the risk's cadence, unless you need more",
            )
        self.sends, self.every = _trackers(spec), every
        self._last = -1  # the step logged last: a second call at one step sends nothing

    def log(self, guard: Any, step: int | None = None) -> None:
        """Send the guard's numbers if ``step`` is a multiple of ``every`` (default: the
        guard's steps done; a framework passes its own ``global_step``, which also counts
        the batches a rescue skipped)."""
        step = guard.run.step_index if step is None else step
        if not self.sends or guard.rank != 0 or step == self._last or step % self.every:
            return
        self._last = step
        metrics = guard_metrics(guard)
        for tracker in list(self.sends):
            name, send = tracker
            try:
                send(metrics, step)
            except Exception as error:  # a tracker's fault never stops training
                self.sends.remove(tracker)
                warnings.warn(
                    f"collapse-guard: tracker {name} failed at step {step} "
                    f"({type(error).__name__}: {error}); it gets no more of the guard's "
                    "numbers, training goes on",
                    RuntimeWarning,
                    stacklevel=2,
                )
