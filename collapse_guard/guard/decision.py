"""What the guard saw at a step (:class:`StepFacts`) and what it decided (:class:`GuardDecision`).

:func:`decide` is a pure function of the facts and the policy: no model, no optimizer,
no clock. The guard gathers the facts, calls it, and one small applier
(``Guard._apply``) executes the decision. Decisions can therefore be logged (they are
the run file's ``event`` column), tested on hand-written facts and replayed.

The order of the rules is the order of their urgency::

    stale     no gradients of this step (no backward(), or guard.step twice for one)
              -> no update: applying old gradients again trains twice on one batch
    give up   rescues spent and a rescue due      -> GuardGaveUp (no silent loop)
    rescue    online collapse (not in data-fault mode) | max_skip_streak non-finite
              losses or gradients in a row (one alone is skipped, as a GradScaler skips
              an overflow: fp16 without a scaler overflows on single batches, and a
              rollback cannot stop that, issue 32) | max_outlier_skips
              z-score skips in a row within lr_jump_steps of an LR jump (a step change
              of the loop's LR, not a smooth rise: reactive.lr_jumped) -> no update,
              roll back to the ring's average, skip batches, cap the LR (a cap that
              lifts while the run stays healthy: rescue.lift_cap)
    average   the first step after a rollback to the ring's average is a loss outlier: the
              mean of the checkpoints left the basin (far-apart checkpoints, sign-update
              optimizers) -> roll back again to the newest checkpoint alone, with no new
              LR cut or batch skips; only a measured checkpoint can tell data from model
    data      the first step after a rollback to one checkpoint is a loss outlier at the
              restored weights: the data went bad, not the model -> data-fault mode:
              outlier batches are skipped and the online collapse does not
              rescue (rolling back cannot fix data) until data_clear_steps clean batches
              in a row; max_data_fault_skips outliers skipped in a row there -> give up
              (the data stayed bad: GuardGaveUp names the pipeline, not the LR)
    skip      non-finite loss or gradient, loss / grad-norm z over outlier_z (critical_outlier_z
              at `critical`) -> no update this step; after max_outlier_skips z-score
              skips in a row the next outlier is applied (clipped): it is the data now
              (outside data-fault mode)
    level     LR multiplier and clipping of the level; a tensor whose gradient norm
              is an outlier is clipped (warn and above); none of it with the
              forecast's actions off (``forecast_actions=False``: the level is read
              as OK); at warn the LR is held (``warn_action="hold"``, the default:
              the applier's WarnHold, warn_hold.py), or scaled (``"scale"``)
    keep      a healthy step checkpoints every checkpoint_every steps, and at watch
              or above, or while the warn's hold is on, when none is recent; the
              guard checkpoints a healthy state before the update of a jump of the
              loop's LR (guard.py), and a rescue of that jump rolls back to it alone

The events a step can carry (the run file's ``event`` column, ``;``-joined):

==========================  ==========================================================
event                       meaning
==========================  ==========================================================
``skip:<reason>``           update not applied (``nonfinite_loss``, ``nonfinite_grad``,
                            ``loss_z=7.1``,
                            ``no_gradients``, ``same_gradients``, ``zero_gradients``,
                            ``after_rescue``: a deferred step's rescue rolled back after
                            this backward, ...)
``checkpoint_refused:..``   a checkpoint was due but a parameter is not finite
``accept:<reason>``         an outlier applied (clipped) after max_outlier_skips skips
``lr_x<m>``                 the level's LR multiplier changed to ``m``
``lr_hold:<lr>``            the LR in force is held at ``lr`` (``warn_action="hold"``: a
                            warn's first step; warn_hold.py)
``lr_hold:off``             the hold, released as the risk fell, reached the loop's LR
``clip_layers:<n>``         ``n`` outlier tensors clipped at warn or above
``checkpoint``              a healthy checkpoint written into the ring
``checkpoint:before_jump``  the loop's LR jumped at this step (``lr_jump_ratio``): the
                            weights before its update are in the ring (written then, or
                            the last step's checkpoint); a rescue of the jump rolls back
                            to them alone
``rescue:<reason>``         a rescue (``nonfinite_loss``: max_skip_streak in a row,
                            ``online_collapse``, ``warn_rise``: the loss rose under the
                            warn's hold, ``GuardPolicy.warn_rescue``; ``warn_stall``: it
                            stopped falling under a hold that stopped a rise,
                            ``warn_stall_steps``, ...)
``rewind:loss_gap=<nats>``  the ring trained worse than its best checkpoint by that much:
                            the rescue rolls back to the best (``rewind_loss_gap``)
``restart:origin``          a first rescue within ``restart_window`` steps of the warmup's
                            end: the weights the guard started with, not the ring's
                            (``rollback:avg1@<its step>``); the ring starts over
``forensics:<folder>``      state and gradient histograms saved under ``forensics/``
``rollback:avg<n>@<step>``  parameters of the ring's ``n`` last checkpoints averaged
``skip_batches:<n>``        ``n`` batches to skip (``guard.batches``)
``lr_ceiling:<lr>``          the LR in force is capped at ``lr`` from now on (rescue; or
                            the forecast's fall, ``GuardPolicy.warn_fall``: rescue.py)
``lr_lift:<lr>``            the cap rose to ``lr`` after a healthy stretch
``lr_ceiling:off``          the cap rose over the loop's LR: gone
``lr_fall:<lr>@<edge>``     a warn or a precursor: the cap fell to ``lr``; ``edge``, the LR
                            in force then, bounds the next rises
``rescue:average_worse:..``  the ring's average is worse than its newest: roll back to it
``data_fault:<reason>``     data-fault mode begins (the restored weights see outliers)
``data_clear``              data-fault mode ends
``layer_caps:<n>``          ``n`` tensors that blew up get a gradient-norm cap
``give_up:<reason>``        the rescue cap is reached, or ``data_fault_skips=<n>``: the
                            data stayed bad; ``GuardGaveUp`` is raised
==========================  ==========================================================
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from collapse_guard.guard.policy import RISK_LEVELS, GuardPolicy
from collapse_guard.predictor.core.levels import CRITICAL, OK, WARN, Level

__all__ = [
    "COLLAPSED",
    "DEVELOPED",
    "GuardDecision",
    "StepFacts",
    "accepts_outliers",
    "decide",
    "is_healthy",
    "next_lr_multiplier",
    "outlier_z",
]


# the rescues of a collapse that developed: the online label's, a warn's precursor or stall
DEVELOPED = ("online_collapse", "warn_rise", "warn_stall")
# the rescues of a collapse (not of an LR jump's outliers, a correction or a drill): those a
# warmup's restart may take (amend.restarts)
COLLAPSED = (*DEVELOPED, "nonfinite_loss", "skip_streak")


@dataclass(frozen=True)
class StepFacts:
    """What the guard knows at step ``step``, before the update is applied."""

    step: int
    loss: float  # this step's loss (the forward ran at the current parameters)
    grad_norm: float  # global L2 norm of the gradients, unscaled, before clipping
    grad_finite: bool = True  # every gradient element finite
    loss_z: float = math.nan  # z-score against the recent finite history (NaN: too short)
    grad_z: float = math.nan
    level: Level = OK  # the latest risk reading's level
    probability: float = math.nan
    lr_multiplier: float = 1.0  # the level multiplier in force before this step
    skip_streak: int = 0  # updates skipped in a row before this step
    collapse_online: bool = False  # the label rule, run live, sees a collapse
    rescues: int = 0  # rescues done so far
    layer_outliers: tuple[str, ...] = ()  # tensors whose gradient norm is an outlier
    since_checkpoint: int = 0  # steps since the last ring checkpoint
    quiet_steps: int = 0  # steps in a row without a skip, excursion or critical level
    amp_overflow: bool = False  # the GradScaler found inf/NaN: its own skip, not ours
    lr_jump: bool = False  # the loop's LR jumped within lr_jump_steps (reactive.lr_jumped)
    after_rollback: bool = False  # the first step at the weights a rollback restored
    averaged_rollback: bool = False  # those weights are a mean of checkpoints, never measured
    data_fault: bool = False  # in data-fault mode before this step
    clean_steps: int = 0  # non-outlier steps in a row while in data-fault mode
    stale_gradients: str = ""  # why the gradients are not this step's ("": they are)
    held: bool = False  # the warn's hold is on (warn_hold.py), released part of the way or not
    warned_rise: bool = False  # the hold is on and the loss shows a precursor (rescue.py),
    # with GuardPolicy.warn_rescue: a developed collapse's rescue without the label's wait
    warned_stall: bool = False  # the hold is on and the smoothed loss stopped falling under
    # it (warn_hold.HoldStall), with GuardPolicy.warn_rescue: a developed collapse's rescue

    def __post_init__(self) -> None:
        if self.level in RISK_LEVELS:  # a level's name (a test, a replay): its Level
            object.__setattr__(self, "level", Level(self.level))


@dataclass(frozen=True)
class GuardDecision:
    """What the applier does at one step; ``events`` is what the run file records."""

    step: int
    level: Level = OK
    probability: float = math.nan
    apply_update: bool = True
    lr_multiplier: float = 1.0  # of the level, over the loop's LR (rescue factor apart)
    clip_to: float = 0.0  # global gradient-norm bound; 0 = no clipping
    clip_layers: tuple[str, ...] = ()  # tensors clipped to layer_outlier_ratio x median
    checkpoint: bool = False
    rescue: bool = False  # roll back, skip batches, lower the LR, clip blown-up layers
    reason: str = ""  # why the update was skipped or the rescue made
    give_up: bool = False
    data_fault: bool = False  # data-fault mode after this step
    rollback_to: tuple[str, ...] = ()  # the checkpoints a rescue averages (set by the guard
    # from its ring, so that every DDP rank reads the same files)
    rewind: bool = False  # rollback_to is the ring's best, past a ring that trained worse
    # (amend.with_rollback): the ring restarts there
    restart: bool = False  # the weights go back past the ring to the guard's origin
    # (amend.restarts: a first rescue in the warmup); rollback_to still gives the cap's LR
    events: tuple[str, ...] = field(default=())

    @property
    def skipped(self) -> bool:
        return not self.apply_update

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GuardDecision:
        data = dict(data)
        for key in ("clip_layers", "rollback_to", "events"):
            data[key] = tuple(data.get(key, ()))
        data["level"] = Level.parse(data.get("level", OK))
        return cls(**data)


def is_healthy(quiet_steps: int, level: Level, policy: GuardPolicy) -> bool:
    """A state fit for a checkpoint: ``healthy_quiet_steps`` quiet steps, not critical."""
    return quiet_steps >= policy.healthy_quiet_steps and level != CRITICAL


def outlier_z(level: Level, policy: GuardPolicy) -> float:
    """The z-score over which a loss or gradient norm is an outlier at ``level`` (the host's
    rule here, the device's gate in ``deferred.py``: one definition for both)."""
    critical = policy.acting_level(level) == CRITICAL  # reactive-only: outlier_z at every level
    return policy.critical_outlier_z if critical else policy.outlier_z


def accepts_outliers(skip_streak: int, data_fault: bool, policy: GuardPolicy) -> bool:
    """After max_outlier_skips z-score skips in a row the next outlier is the data now
    (applied, clipped), except in data-fault mode; right after an LR jump it is rescued."""
    return not data_fault and skip_streak >= policy.max_outlier_skips


def next_lr_multiplier(current: float, level: Level, policy: GuardPolicy) -> float:
    """The level's multiplier: down at once, back up by doubling every lr_restore_steps."""
    target = policy.level_lr(level)
    if target <= current:
        return target
    rate = 2.0 ** (1.0 / policy.lr_restore_steps) if policy.lr_restore_steps else math.inf
    return min(target, current * rate)


_NONFINITE_SKIPS = ("nonfinite_loss", "nonfinite_grad")


def _rescue_reason(facts: StepFacts, policy: GuardPolicy) -> str:
    skip, streak = _skip_reason(facts, policy), facts.skip_streak + 1
    if streak >= policy.max_skip_streak and skip == "nonfinite_loss":
        return "nonfinite_loss"
    if facts.collapse_online and not facts.data_fault:
        return "online_collapse"
    if facts.warned_rise and not facts.data_fault:
        return "warn_rise"
    if facts.warned_stall and not facts.data_fault:
        return "warn_stall"
    if streak >= policy.max_skip_streak and skip == "nonfinite_grad":
        return f"skip_streak={streak}"
    if facts.after_rollback and facts.averaged_rollback and skip.startswith("loss_z"):
        return f"average_worse:{skip}"  # the mean of the ring is off the basin: the newest alone
    outliers = skip and skip not in _NONFINITE_SKIPS
    if outliers and facts.lr_jump and accepts_outliers(facts.skip_streak, facts.data_fault, policy):
        return f"lr_jump:{skip}"  # the outliers follow the LR's jump: the model broke
    return ""


def _skip_reason(facts: StepFacts, policy: GuardPolicy) -> str:
    if not math.isfinite(facts.loss):
        return "nonfinite_loss"
    if not facts.grad_finite and not facts.amp_overflow:
        return "nonfinite_grad"
    z = outlier_z(facts.level, policy)
    for name, value in (("loss_z", facts.loss_z), ("grad_z", facts.grad_z)):
        if value > z:  # NaN (too little history) compares False
            return f"{name}={value:.1f}"
    return ""


def decide(facts: StepFacts, policy: GuardPolicy) -> GuardDecision:
    """The decision for one step (the module docstring gives the rules and their order)."""
    if not isinstance(facts.level, Level):
        names = tuple(level.value for level in RISK_LEVELS)
        raise ValueError(f"level must be one of {names}, got {facts.level!r}")
    common = {"step": facts.step, "level": facts.level, "probability": facts.probability}
    lr = next_lr_multiplier(facts.lr_multiplier, facts.level, policy)
    if facts.stale_gradients:
        return GuardDecision(
            **common,
            apply_update=False,
            lr_multiplier=facts.lr_multiplier,
            reason=facts.stale_gradients,
            data_fault=facts.data_fault,
            events=(f"skip:{facts.stale_gradients}",),
        )
    rescue = _rescue_reason(facts, policy)
    if rescue:
        if facts.rescues >= policy.max_rescues:
            return _give_up(common, lr, rescue)
        return GuardDecision(
            **common,
            apply_update=False,
            lr_multiplier=lr,
            rescue=True,
            reason=rescue,
            clip_layers=facts.layer_outliers,
            events=(f"rescue:{rescue}",),
        )
    events = []
    if lr != facts.lr_multiplier:
        events.append(f"lr_x{lr:.3g}")
    skip = _skip_reason(facts, policy)
    data_fault = _data_fault(facts, policy, skip, events)
    if skip and data_fault and _data_stayed_bad(facts.skip_streak + 1, policy):
        reason = f"data_fault_skips={facts.skip_streak + 1}"
        return _give_up(common, lr, reason, events, data_fault=True)
    accept = accepts_outliers(facts.skip_streak, data_fault, policy)
    if skip and skip not in _NONFINITE_SKIPS and accept:
        events.append(f"accept:{skip}")  # the outlier persists: it is the data now
        skip = ""
    if skip:
        return GuardDecision(
            **common,
            apply_update=False,
            lr_multiplier=lr,
            reason=skip,
            data_fault=data_fault,
            events=(*events, f"skip:{skip}"),
        )
    layers = facts.layer_outliers if policy.acting_level(facts.level) >= WARN else ()
    if layers:
        events.append(f"clip_layers:{len(layers)}")
    healthy = is_healthy(facts.quiet_steps, facts.level, policy)
    due = policy.checkpoint_every and facts.since_checkpoint >= policy.checkpoint_every
    # a held run was warned: its risk falls as the hold stops the LR's rise (the model reads
    # the rise), not because the collapse went away; keep the watch's cadence until it is off
    watchful = (
        facts.level > OK or facts.held
    ) and facts.since_checkpoint >= policy.watch_checkpoint_gap
    checkpoint = bool(healthy and (due or watchful))
    if checkpoint:
        events.append("checkpoint")
    return GuardDecision(
        **common,
        lr_multiplier=lr,
        clip_to=policy.level_clip(facts.level),
        clip_layers=layers,
        checkpoint=checkpoint,
        data_fault=data_fault,
        events=tuple(events),
    )


def _give_up(
    common: dict, lr: float, reason: str, events: list | tuple = (), *, data_fault: bool = False
) -> GuardDecision:
    """A decision that stops the run (``GuardGaveUp``): no update, ``give_up:<reason>``."""
    return GuardDecision(
        **common,
        apply_update=False,
        lr_multiplier=lr,
        reason=reason,
        give_up=True,
        data_fault=data_fault,
        events=(*events, f"give_up:{reason}"),
    )


def _data_stayed_bad(streak: int, policy: GuardPolicy) -> bool:
    return 0 < policy.max_data_fault_skips <= streak


def _data_fault(facts: StepFacts, policy: GuardPolicy, skip: str, events: list) -> bool:
    """Data-fault mode after this step (module docstring), its events added to ``events``."""
    if facts.after_rollback and skip.startswith("loss_z"):
        events.append(f"data_fault:{skip}")
        return True
    if facts.data_fault and not skip and facts.clean_steps + 1 >= policy.data_clear_steps:
        events.append("data_clear")
        return False
    return facts.data_fault
