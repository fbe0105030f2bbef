"""The guard's state, in two dataclasses a checkpoint carries by their fields.

:class:`RunState` is what the run has learnt about itself (counts, the level, the LR cap,
the events): a rollback keeps it. :class:`Trajectory` is where training stands (outlier
histories, the online label, the risk window, the LR in force): a rollback restores it
from its checkpoint. ``Guard.state_dict()`` is ``{"version", "run", "trajectory"}``;
``run`` holds every field of :class:`RunState` marked :func:`kept` (plain values: the
checkpoint loads with ``weights_only=True``), the others live for one process only.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from collapse_guard.features.ring import SignalRing
from collapse_guard.guard.policy import GuardPolicy
from collapse_guard.guard.qk_clip import QKPlan
from collapse_guard.guard.reactive import OnlineLabel, OutlierHistory
from collapse_guard.guard.regroup import load_across_groups
from collapse_guard.predictor.core.levels import OK, WARN, Level
from collapse_guard.signals import SIGNAL_NAMES

__all__ = ["STATE_VERSION", "InState", "RunState", "Training", "Trajectory", "kept"]

STATE_VERSION = 2  # layout of Guard.state_dict(); bump when a key changes meaning (2: the
# rescue LR factor became a cap, `lr_ceiling`; `run_id`, `loop_lrs`, data-fault mode added).
# A key added since is optional (``kept(optional=True)``): a checkpoint without it loads
# with the default, so no bump (QK-clip's; the lifting cap's, issue 32)


def _same(_old: Any, value: Any) -> Any:
    return value


def _same_value(value: Any) -> Any:
    return value


def kept(
    dump: Callable[[Any], Any] = _same_value,
    load: Callable[[Any, Any], Any] = _same,
    optional: bool = False,
) -> dict[str, Any]:
    """The metadata of a field a checkpoint carries: ``dump(value)`` is plain,
    ``load(current, saved)`` gives it back; ``optional``: absent in older checkpoints
    (the default stands)."""
    return {"dump": dump, "load": load, "optional": optional}


def _dump_plan(plan: QKPlan) -> dict[str, list[list[float]]]:
    return {name: [list(q), list(k)] for name, (q, k) in plan.items()}


def _load_plan(_old: QKPlan, saved: Mapping[str, Any]) -> QKPlan:
    return {name: ([*map(float, q)], [*map(float, k)]) for name, (q, k) in saved.items()}


@dataclass
class RunState:
    """What the run has learnt about itself: kept across rollbacks."""

    step_index: int = field(default=0, metadata=kept())
    level: Level = field(
        default=OK, metadata=kept(dump=lambda level: level.value, load=lambda _, s: Level.parse(s))
    )
    probability: float = field(default=math.nan, metadata=kept())
    lr_multiplier: float = field(default=1.0, metadata=kept())  # of the level
    # cap on the LR in force (group 0), set by rescues, lifted and lowered after them
    # (rescue.lift_cap); the four fields below are absent in checkpoints before issue 32
    lr_ceiling: float = field(default=math.inf, metadata=kept())
    lr_floor: float = field(default=math.inf, metadata=kept(optional=True))  # the last
    # rescue's cap: a fall goes no lower
    lr_edge: float = field(default=math.inf, metadata=kept(optional=True))  # the LR in
    # force when the run last fell back (a fall, a second rescue): rises stop below it
    lr_anchor: float = field(default=math.inf, metadata=kept(optional=True))  # the loop's
    # LR when the cap was set, with GuardPolicy.cap_follows_schedule (:meth:`lr_cap`)
    lift_quiet: int = field(default=0, metadata=kept(optional=True))  # healthy steps in
    # a row towards the cap's next rise
    lift_troubled: bool = field(default=False, metadata=kept(optional=True))  # the last
    # step was a warn or a loss precursor: one fall an episode
    data_fault: bool = field(default=False, metadata=kept())  # data-fault mode (decision.py)
    # non-outlier steps in a row in data-fault mode
    clean_steps: int = field(default=0, metadata=kept())
    # the next step runs at weights a rollback restored, and they are a mean of several
    after_rollback: bool = field(default=False, metadata=kept())
    averaged_rollback: bool = field(default=False, metadata=kept())
    layer_bounds: dict[str, float] = field(  # tensor -> gradient-norm cap after rescues
        default_factory=dict, metadata=kept(dump=dict, load=lambda _, saved: dict(saved))
    )
    pending_skips: int = field(default=0, metadata=kept())  # batches a rescue asked to skip
    rescues: int = field(default=0, metadata=kept())
    skipped: int = field(default=0, metadata=kept())
    checkpoints: int = field(default=0, metadata=kept())
    first_warning: int | None = field(default=None, metadata=kept())  # first step at warn+
    # heads clipped; rank 0's QK-clip plan from the last probe pass, applied after the next
    # update on every rank (qk_clip.py); both absent in checkpoints saved before QK-clip
    qk_clips: int = field(default=0, metadata=kept(load=lambda _, n: int(n), optional=True))
    qk_pending: QKPlan = field(
        default_factory=dict, metadata=kept(dump=_dump_plan, load=_load_plan, optional=True)
    )
    events: list[tuple[int, str]] = field(
        default_factory=list,
        metadata=kept(
            dump=lambda events: [list(e) for e in events],
            load=lambda _, saved: [(int(s), str(e)) for s, e in saved],
        ),
    )
    loop_lrs: deque[float] = field(  # the loop's LR of the recent steps (the LR-jump rule)
        default_factory=deque,
        metadata=kept(
            dump=list, load=lambda old, saved: deque(map(float, saved), maxlen=old.maxlen)
        ),
    )
    # the first step whose loop LR did not rise over the last one: the end of the first
    # rise (a warmup); None while it rises (GuardPolicy.restart_window)
    rise_ended: int | None = field(default=None, metadata=kept(optional=True))
    # a restart from the origin warms the cap up again, linearly from rewarm_start over
    # rewarm_steps (the loop's first rise): init weights take no full LR at once
    rewarm_start: int = field(default=0, metadata=kept(optional=True))
    rewarm_steps: int = field(default=0, metadata=kept(optional=True))
    # for this process only
    skip_streak: int = 0  # updates skipped in a row
    quiet_steps: int = 0  # steps in a row without a skip, excursion or critical level
    last_checkpoint: int = -(10**9)  # step of the last one; none yet: the first healthy
    # step writes one
    jump_checkpoint: int | None = None  # the ring checkpoint (its resume step) written
    # before the loop's last LR jump: an LR jump's rescue rolls back to it alone
    # where the last risk reading came from ("embedded", "service", "fallback"), and the
    # version of the model that scored it (RiskReading)
    risk_source: str = ""
    risk_model_version: str | None = None
    # (window's last step, P(collapse) held over the model's hold_steps)
    risk_readings: list[tuple[int, float]] = field(default_factory=list)
    continues: dict[str, Any] | None = None  # the run file a resume continues

    @classmethod
    def fresh(cls, policy: GuardPolicy) -> RunState:
        return cls(loop_lrs=deque(maxlen=2 * policy.lr_jump_steps))

    def note_loop_lr(self, loop_lr: float) -> None:
        """The loop's LR of step ``step_index``, before it is appended: the first that does
        not rise ends the first rise (:attr:`rise_ended`)."""
        if self.rise_ended is None and self.loop_lrs and not loop_lr > self.loop_lrs[-1]:
            self.rise_ended = self.step_index
        self.loop_lrs.append(loop_lr)

    def hear(self, reading: Any) -> None:
        """A (held) risk reading arrived: its level and probability are in force."""
        self.level, self.probability = reading.level, reading.probability
        self.risk_source, self.risk_model_version = reading.source, reading.model_version
        self.risk_readings.append((reading.step, reading.probability))
        if self.first_warning is None and reading.level >= WARN:
            self.first_warning = self.step_index

    def take_skip(self) -> bool:
        """True while a rescue asks to skip batches (each call consumes one)."""
        if self.pending_skips > 0:
            self.pending_skips -= 1
            return True
        return False

    def resumed(self, checkpoint: str, run_id: str) -> None:
        """This state was loaded from ``checkpoint`` of run ``run_id``: the new run file
        continues that one (``continues``), from the step after the checkpoint's."""
        self.last_checkpoint = self.step_index - 1  # the state after that step
        self.continues = {"run_id": run_id, "step": self.step_index, "checkpoint": checkpoint}
        self.events.append((self.step_index, f"resume:{checkpoint}"))

    def cap_ratio(self) -> float:
        """How far the loop's newest LR fell under ``lr_anchor``, at most 1: ``lr_ceiling``,
        ``lr_floor`` and ``lr_edge`` are LRs at the anchor, this times them the LRs now
        (GuardPolicy.cap_follows_schedule; 1 when the cap stands still)."""
        if not self.loop_lrs or not math.isfinite(self.lr_anchor):
            return 1.0
        return min(1.0, self.loop_lrs[-1] / self.lr_anchor)

    def lr_cap(self) -> float:
        """The rescues' cap at the loop's newest LR (:meth:`cap_ratio`), warming up after a
        restart (:meth:`rewarm_share`); no cap (inf) stays none at a loop LR of 0."""
        return self.settled_cap() * self.rewarm_share()

    def settled_cap(self) -> float:
        """The cap at the loop's newest LR once a restart's warmup is over (:meth:`lr_cap`
        without :meth:`rewarm_share`): what a later rescue halves."""
        if not math.isfinite(self.lr_ceiling):
            return self.lr_ceiling
        return self.lr_ceiling * self.cap_ratio()

    def rewarm_share(self) -> float:
        """The share of the cap a restart's warmup gives at ``step_index`` (1 without one)."""
        done = max(1, self.step_index - self.rewarm_start + 1)
        return min(1.0, done / self.rewarm_steps) if self.rewarm_steps else 1.0

    def summary(self) -> dict[str, Any]:
        """Counts of what the guard did (also the run file's ``extra["guard"]``)."""
        return {
            "steps": self.step_index,
            "skipped": self.skipped,
            "rescues": self.rescues,
            "checkpoints": self.checkpoints,
            "first_warning": self.first_warning,
            "lr_ceiling": self.lr_cap(),  # as it stands at the loop's LR, not as it was set
            "risk_source": self.risk_source,
            "risk_model_version": self.risk_model_version,
            "qk_clips": self.qk_clips,
        }

    def state_dict(self) -> dict[str, Any]:
        """The kept fields, as plain values."""
        return {f.name: f.metadata["dump"](getattr(self, f.name)) for f in _kept_fields()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`: a field absent is an error unless ``optional``."""
        for f in _kept_fields():
            if f.name in state or not f.metadata["optional"]:
                setattr(self, f.name, f.metadata["load"](getattr(self, f.name), state[f.name]))


def _kept_fields() -> list:
    return [f for f in fields(RunState) if "dump" in f.metadata]


@dataclass
class Trajectory:
    """Where training stands: what a rollback restores from its checkpoint."""

    loss_history: OutlierHistory
    grad_history: OutlierHistory
    online: OnlineLabel
    window: SignalRing  # preallocated: no rows of lists, no DataFrame; scored through
    # the extractor's array path
    context: Any = None  # the risk model's RunContext (None without a risk model)
    lr_in_force: float = math.nan  # group 0's LR at the last applied update

    @classmethod
    def fresh(cls, policy: GuardPolicy, window_size: int, context: Any = None) -> Trajectory:
        p = policy
        if context is not None:
            context.reset()
        return cls(
            OutlierHistory(p.outlier_history, p.outlier_min_history),
            OutlierHistory(p.outlier_history, p.outlier_min_history),
            OnlineLabel(p.collapse_confirm_steps),
            SignalRing(window_size, SIGNAL_NAMES),
            context,
        )

    def restarted(self, policy: GuardPolicy) -> Trajectory:
        """A fresh trajectory of the same window and context (a rescue without a checkpoint)."""
        return Trajectory.fresh(policy, self.window.capacity, self.context)

    def state_dict(self) -> dict[str, Any]:
        steps, rows = self.window.state()
        return {
            "loss_history": self.loss_history.state_dict(),
            "grad_history": self.grad_history.state_dict(),
            "online": self.online.state_dict(),
            "window_steps": steps,
            "window": rows,
            "context": self.context.state_dict() if self.context is not None else None,
            "lr_in_force": self.lr_in_force,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loss_history.load_state_dict(state["loss_history"])
        self.grad_history.load_state_dict(state["grad_history"])
        self.online.load_state_dict(state["online"])
        self.window.load(state["window_steps"], state["window"])
        if self.context is not None and state["context"] is not None:
            self._load_context(state["context"])
        self.lr_in_force = float(state.get("lr_in_force", math.nan))

    def _load_context(self, saved: Mapping[str, Any]) -> None:
        """The risk model's run context back; one another version saved (or of other
        signals) is rebuilt from the window's rows instead: a checkpoint of an older
        collapse-guard still resumes, its run-long fields starting from the window."""
        try:
            self.context.load_state_dict(saved)
        except (ValueError, TypeError, KeyError) as error:
            window = self.window.window()
            self.context.reset()
            for step, row in zip(window.steps.tolist(), window.values.tolist(), strict=True):
                self.context.update(step, dict(zip(window.signals, row, strict=True)))
            warnings.warn(
                f"collapse-guard: the checkpoint's run context does not load ({error}); "
                f"rebuilt from the {len(window.steps)} steps of its risk window, so the "
                "fields that span the run (the early loss, the LR's peak) start there",
                RuntimeWarning,
                stacklevel=2,
            )


@dataclass
class Training:
    """The user's objects the guard saves and restores: model, optimizer, scaler."""

    model: Any
    optimizer: Any
    scaler: Any = None

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load(self, state: Mapping[str, Any], keep_lr: bool = False) -> str:
        """Restore a checkpoint's; ``keep_lr``: the loop's LR stays (a rollback), and the
        optimizer's groups may have grown since (``regroup``). Returns what a rollback could
        not keep as it was, for a warning ('' when all)."""
        lrs = [g["lr"] for g in self.optimizer.param_groups] if keep_lr else None
        self.model.load_state_dict(state["model"])
        note = ""
        if keep_lr:
            note = load_across_groups(self.optimizer, state["optimizer"])
        else:  # a resume: the optimizer is the one the checkpoint was written from
            self.optimizer.load_state_dict(state["optimizer"])
        if lrs is not None:
            for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        return note


class InState:
    """An attribute of the guard that lives in one of its parts (``holder``: the guard's
    attribute holding it), read and written there."""

    def __init__(self, holder: str, name: str = "") -> None:
        self.holder, self.name = holder, name  # name: the holder's, if not the guard's

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    def __get__(self, guard: Any, owner: type | None = None) -> Any:
        return self if guard is None else getattr(getattr(guard, self.holder), self.name)

    def __set__(self, guard: Any, value: Any) -> None:
        setattr(getattr(guard, self.holder), self.name, value)
