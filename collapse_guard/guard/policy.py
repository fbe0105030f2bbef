"""The guard's settings: one flat dataclass, every number with its unit and its evidence.

Levels come from the risk model's own thresholds (``RiskModel.thresholds``: false-alarm
budgets on healthy validation runs); this file says what the guard does at each level,
how it decides that an update is an outlier, and when it rescues.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from collapse_guard._config import reject_unknown_keys
from collapse_guard.predictor.core.levels import CRITICAL, OK, RISK_LEVELS, WARN, Level

__all__ = [
    "HOLD_RELEASES",
    "QK_CLIP_MODES",
    "RISK_LEVELS",
    "WARN_ACTIONS",
    "GuardPolicy",
    "policy_keyword",
    "resolve_policy",
]

QK_CLIP_MODES: tuple[str, ...] = ("off", "always", "watch", "rescue")
WARN_ACTIONS: tuple[str, ...] = ("scale", "hold")
HOLD_RELEASES: tuple[str, ...] = ("watch", "warn")
_CHOICES = {"qk_clip": QK_CLIP_MODES, "warn_action": WARN_ACTIONS, "hold_release": HOLD_RELEASES}
_SWITCHES = ("forecast_actions", "cap_follows_schedule", "warn_rescue")  # the fields of a bool


@dataclass
class GuardPolicy:
    """What :class:`collapse_guard.guard.Guard` does, and when; unknown keys are an error."""

    # --- risk ---
    risk_every: int = 10  # steps between risk requests: the embedded model costs ~4 ms a
    # window (200 steps, 23 signals; measured on the loaded 2-core machine), 0.4 ms a step
    # at 10; collapses that develop take 50-300 steps (real-run recipes), so 10 loses nothing

    # --- reactive path (every step, before the update) ---
    outlier_history: int = 128  # steps of finite loss / grad norm the z-scores read
    # (OLMo-core's skip-step rule reads 128 steps too)
    outlier_z: float = 10.0  # skip an update whose loss or grad-norm z-score exceeds this;
    # 10, not OLMo-core's 6: at 6 healthy runs lost up to 0.028-0.034 nats to skipped
    # batches (11 skips on one), at 10 up to 0.004-0.022 (one skip), two CPUs; the saves the
    # same but one missed by 0.01 nats (benchmarks/guard_rescue.py, 2026-12-03: skip_z6;
    # docs/decisions.md 22)
    outlier_min_history: int = 20  # no outlier rule before this many finite steps: the
    # first steps fall fast (label.py's settle_steps is 30 for the same reason)
    critical_outlier_z: float = 3.0  # at `critical`, skip batches over this z (a step
    # of 3 sigma is 1 in 740 on healthy Gaussian noise: a few skips per healthy 1k steps)

    # --- clipping (global L2 norm of the gradients, after unscaling) ---
    clip: float = 1.0  # the seed's safe range is 0.5-1.0 (nanoGPT's grad_clip = 1.0); 0 = off
    warn_clip: float = 0.5  # the seed range's tighter end
    critical_clip: float = 0.25  # half again: a critical run is past the seed's range
    layer_outlier_ratio: float = 5.0  # at warn and above, a tensor whose gradient norm is
    # this many times its median over the forensic history is clipped to that bound

    # --- the forecast's actions (issue 32: what acting on the forecast buys) ---
    forecast_actions: bool = True  # False: the risk level changes nothing in training (no
    # warn / critical LR, clip or outlier bound, no layer clipping, no hold): the reactive
    # rules, rescues and checkpoints alone, the level still read and recorded (the rescue
    # benchmark's reactive_only arm)
    warn_action: str = "hold"  # at warn: "hold": the LR in force at the warn's first step
    # is a ceiling while the risk stays at warn or above (warn_hold.py: a rise stopped, no
    # cut), released by doubling every lr_restore_steps after; "scale": the LR times
    # warn_lr. critical scales by critical_lr in both. "hold" since the 640-run model (its
    # lower warn acts earlier, and a halving compounds into the rescue's cap): 12/12
    # saveable develops saved, -0.017 nats against the safe-LR run, where halving saved 9
    # (benchmarks/guard_rescue.py, 2026-12-03: guarded_hold; docs/decisions.md 20)
    hold_release: str = "warn"  # the level the risk must fall under before the hold's
    # ceiling rises: "warn", or "watch" (an alarm's hysteresis: a risk that hovers between
    # watch and warn keeps the hold). "watch" held the demo's re-warm where "warn" let it
    # creep past the edge, but on the rescue benchmark (a Zen 5, 2026-12-04) it saved 9 of
    # 11 saveable develops against 11, +0.011 nats against the safe-LR run against -0.025:
    # held near the edge a run trains worse than one rescued to a quarter of its LR
    # (benchmarks/guard_rescue.py arm hold_watch; docs/decisions.md 23)

    # --- LR multiplier (applied at step time, over whatever LR the loop set) ---
    warn_lr: float = 0.5  # the real runs collapse 1.5-4x past the stable edge (sampler.py
    # STABLE_EDGE); halving brings a 2x excursion back to the edge
    critical_lr: float = 0.25  # brings a 4x excursion back to the edge
    lr_restore_steps: int = 100  # steps for the multiplier to double back up as risk
    # falls (geometric): a level left is not trusted at once; ~2 risk readings per halving
    rescue_lr: float = 0.5  # a rescue caps the LR in force, for the rest of the run, at
    # this times the LR in force at the checkpoint it rolls back to (or at the cap already
    # there, if lower). A cap, not a factor on the loop's LR: a re-warm, a warmup or an LR
    # fault keeps raising the loop's LR after the rollback, and a factor of 1/2 on an LR
    # that jumped 30x (the sampler's sudden recipe: 4-15x the edge) collapses again. The
    # cap rests on evidence: the run was healthy at the checkpoint's LR
    developed_rescue_lr: float = 0.25  # the cap's factor instead when the rescue is of a
    # collapse that developed (``online_collapse``: the label's rule, run live, saw the loss
    # rise for 30+ steps at the LRs that led there, so the checkpoint's LR was already on
    # the way); a rescue of a non-finite loss keeps rescue_lr, of outliers after an LR
    # jump takes jump_rescue_lr (the checkpoint's LR, before the fault, was sound)
    jump_rescue_lr: float = 1.0  # the cap's factor instead when the rescue is of outliers
    # after a jump of the loop's LR (``lr_jump``): the checkpoint predates the jump, its LR
    # is the schedule's, and the cap follows the schedule down from there (below)
    cap_follows_schedule: bool = True  # a cap set at the loop's LR l falls with it: the LR
    # in force is at most cap x min(1, loop LR / l). Under a cap that stood still (the rule
    # until 2026-12-06) the loop's decay (a cosine, a jumped LR x its cosine) went unfelt
    # and the run missed its anneal: unseen sudden collapses ended 0.128 nats over the
    # safe-LR run, 0.051 with both. A rise of the loop's LR stays capped

    # --- checkpoints ---
    checkpoint_every: int = 100  # healthy steps between ring checkpoints (0 = only at
    # watch); a 136k-parameter model saves in ~5 ms, <0.1% of 100 steps
    watch_checkpoint_gap: int = 20  # at `watch`, checkpoint if none in this many steps
    keep_checkpoints: int = 3  # the healthy ring; a rollback averages these (docs/design.md)
    # when they share a basin with the newest (checkpoints.py), both rules below holding
    # (average_span, average_loss_gap; one more file sits on disk: the lowest-loss
    # checkpoint written, kept for rewind_loss_gap):
    average_span: int = 300  # steps back from the newest; the default ring (3 checkpoints
    # 100 steps apart) spans 200, and a wider one was broken by skips or excursions
    rewind_loss_gap: float = 0.05  # nats: a developed collapse's rescue (decision.DEVELOPED:
    # the online label's, a warn's rise) rolls back past the ring to the best checkpoint the
    # ring wrote when the newest's
    # recorded loss stands this far over the best's: the ring's checkpoints were healthy
    # by every rule yet trained worse (an LR past the edge that the loss slowly could not
    # absorb); 0 = off. Over the noise of a recorded loss (a mean of 20 batches: a few
    # hundredths) and under the label's smallest margin (0.25). 0.15 until 2026-12-07: a
    # slow ramp's loss creeps up 0.06-0.15 nats before its collapse, and the ring's average
    # kept that creep (docs/decisions.md 26)
    restart_window: int = 50  # the first rescue (of a collapse, not of an LR jump) within
    # this many steps of the end of the loop's first LR rise (its warmup: the first step whose
    # LR did not rise) restarts from the weights the guard started with (``guard-origin.pt``,
    # written at its first step) at the rescue's cap, not from the ring: every checkpoint
    # was trained at the rising LRs the run could not absorb, and a lower LR does not undo
    # what they did (SGD's attention weights at 8x a safe run's norm, Lion in fp16 standing
    # at 3.1 from step 50: benchmark 89, unseen 00575 and 00895 of issue 32 ended over their
    # bigram entropy after the ring's rollback). 0 = off (no origin file written)
    average_loss_gap: float = 0.05  # |recorded loss - newest's| / newest's. nanoGPT's GPT on
    # its first 111 steps: the checkpoint of step 11 (loss still falling fast, far above
    # the newest's) went into the mean (issue 21); between checkpoints 100 steps apart in
    # steady training the loss moves by a few percent at most
    watch_attention_every: int = 5  # ProbeConfig.attention_every while at watch or above
    # (default 10): entropy collapse can fall 1.3 -> 0.01 nats in 40 steps

    # --- rescue ---
    collapse_confirm_steps: int = 30  # steps the smoothed loss must stay over the label's
    # margin before the guard calls it a collapse online. The label waits for its recovery
    # window (3,000 steps); a live run cannot. 30 steps = 3 EWMA time constants of the
    # label's smoothing: a single spike of 1-1.3 nats moves the EWMA by 0.12 and is gone
    max_skip_streak: int = 3  # non-finite losses or gradients in a row that trigger a rescue
    max_outlier_skips: int = 2  # z-score skips in a row; the next outlier is applied
    # (clipped): a shift that lasts is data, not an accident. The demo's byte-level data at
    # batch 8 has runs of 2-3 batches of unusual content (loss 8-10 nats against ~3) that
    # the unguarded run absorbs in a step; rescuing on them cost 3 rollbacks and 7/8 of
    # the LR in the warmup (demo, measured 2026-11-30). Two exceptions: right after an LR
    # jump the streak is rescued (lr_jump_ratio), in data-fault mode it is never accepted
    lr_jump_ratio: float = 2.0  # the loop's LR rose more than this over lr_jump_span
    # steps, at one of the last lr_jump_steps steps: an outlier streak that follows is the
    # optimizer's doing, not the data's, so it is rescued at once instead of accepted. The
    # sampler's sudden recipes rise at least 2.4x in their first step (a jump of 4-15x the
    # edge from 0.1-0.5x, at once or by a 1-5 step re-warm); a linear warmup rises by under
    # 1.05x a step from step 20 on (where the outlier rule starts), a linear ramp to 100x
    # over 300 steps by 1.33x at most, a geometric one to 1000x by 1.023x
    lr_jump_steps: int = 10  # steps after a jump that an outlier streak is rescued in
    lr_jump_span: int = 1  # a jump is the loop's LR (the param group's, before the guard's
    # multiplier) over lr_jump_ratio x its LR this many steps before. 1: a step change
    # between consecutive scheduled LRs; a smooth rise is the forecast's and the online-
    # collapse rule's to judge (issue 32: a ramp to 100x over 300 steps was rescued at 4x
    # and capped at half its base LR for good; benchmarks/ramp_rescues.py). 10 is about the
    # rule before issue 32 (any 2x within 10 steps: a fast ramp was a jump)
    data_clear_steps: int = 20  # in data-fault mode (a rollback whose first batch is still
    # an outlier at the restored, healthy weights: the data went bad, not the model),
    # outlier batches are skipped (up to max_data_fault_skips in a row) and not rolled back
    # into; the mode ends after this many non-outlier batches in a row
    max_data_fault_skips: int = 200  # batches skipped in a row in data-fault mode before
    # GuardGaveUp: a bad shard passes, a pipeline that went bad for good would skip every
    # batch to the end and train nothing (a corrupt ramp skipped 430 batches silently,
    # issue 32); 200, the forecast's horizon; 0 = skip without limit
    skip_batches: int = 20  # batches skipped after a rollback (the data that led there)
    max_rescues: int = 5  # rescues per run; one more stops training with GuardGaveUp
    # --- the rescue's LR cap gives the LR back (issue 32; rescue.py's lift_cap) ---
    lr_lift_steps: int = 0  # healthy steps in a row (no skip, no precursor below, no
    # warn) before each rise of the cap; 0 = the cap stays for the rest of the run. Off by
    # default: at 20 (2 risk readings, 2/3 of collapse_confirm_steps) the demo ended 0.13
    # nats worse, and on the rescue benchmark's 45 collapses it saved 9 of the 11 saveable
    # develops against 11 (1.25x per 60 steps: 9 too): lifted back toward the LR that
    # collapsed, runs train worse (benchmarks/README.md, "Guard rescue, per configuration")
    lr_lift: float = 1.5  # each rise multiplies the cap by this: a doubling in ~34
    # healthy steps, back from 0.5x to 1x of a checkpoint's LR in 40; a rise of 1.5x is
    # under lr_jump_ratio, no jump by the guard's own rule. The cap is gone once a rise
    # takes it over the loop's LR (and under the edge's bound below)
    lr_fall: float = 0.5  # a rising cap falls to this x the LR in force at the first step
    # of a warn or of a precursor (an open loss excursion: the online-collapse rule's; or
    # lr_lift_loss_rise), and that LR is remembered as the edge (never below the rescue's
    # own cap)
    warn_rescue: bool = True  # while the warn's hold is on, a precursor of the loss
    # (rescue.precursor) is a developed collapse's rescue at once (reason warn_rise), not
    # after the online label's margin and 30 steps; before any other rescue only. On the
    # rescue benchmark's 8 warned collapses (2026-12-06, Xeon) steps lost 209 against 1,000 for
    # the reactive path alone and 1,488 for the hold alone, final -0.020 nats against the
    # reactive path (median; 11 +0.437); no healthy run or ramp warned (benchmarks/README.md)
    warn_fall: float = 0.0  # the forecast's fall (rescue.warn_fall): while the warn's hold
    # is on, a precursor of the loss (rescue.precursor) caps the LR at this x the hold's
    # ceiling, as a rescue's cap without its rollback; 0 = off. Off by default: at 0.25, on
    # the 8 configurations of the rescue benchmark that warned (2026-12-06, Xeon) no rescue
    # was left to do (0 steps lost against 326, and 302 for the reactive path), final -0.029
    # nats median where both saved, the demo 2.545 with no rescue (2.596 with one); but 36
    # ended over its bigram (best 2.416 against 2.413), and the whole benchmark, the ramps
    # and the README's demo were not redone with it (benchmarks/README.md, "Guard rescue")
    warn_stall_steps: int = 100  # while the warn's hold is on, the smoothed loss must fall
    # by warn_stall_gain every this many steps; where it does not, the run stalls at the LR
    # it holds (an LR at its edge trains no further) and it is a developed collapse's rescue
    # (reason warn_stall, warn_hold.HoldStall), as warn_rise's: before any other rescue,
    # with warn_rescue only; 0 = off. A hold under which the loss stood still for 330 steps
    # lost them all to the warn_rise rescue that came after (00802, issue 32). Only while the
    # hold stops a rise (the loop's LR over the held one): in a late decay a loss gains less as
    # a matter of course. On the rescue benchmark and its 130 unseen collapses (2026-12-07,
    # Xeon) 9 of 190 configurations changed, 8 ended lower (11: 2.936 -> 2.669), 00691 +0.036
    # (docs/decisions.md 29; benchmarks/README.md, "Guard rescue")
    warn_stall_gain: float = 0.02  # nats of the smoothed loss (the label's EWMA) a held run
    # must gain per warn_stall_steps
    lr_edge_share: float = 0.7  # the cap rises no higher than this x the edge: the LR in
    # force when the run last fell back (a fall, or a second rescue: the LR it came at)
    lr_lift_loss_rise: float = 0.1  # nats of the smoothed loss (the label's EWMA) over its
    # best that are a precursor too: a rise whose LR trains worse is undone. A stable LR can
    # still train worse (benchmarks/ramp_rescues.py: the 1000x ramp's cap, lifted to 68x the
    # base LR on warn and excursions alone, ended 0.31 nats over the cap kept for good);
    # 0.1 is 0.4x the label's smallest margin (0.25 nats): well before an excursion opens
    lr_lift_loss_z: float = 6.0  # ... and by this many times the smoothed loss's noise
    # (rescue.precursor): the best is a minimum of a noisy curve. On the guard tests' tiny
    # model (batches of 8 x 16 tokens) the smoothed loss strays up to 0.22 nats, 4.6 noises,
    # over its best in 340 healthy steps
    rescue_layer_clip: float = 3.0  # after a rescue, each tensor whose gradient blew up
    # (over layer_outlier_ratio x its median) is clipped at this many times its median
    healthy_quiet_steps: int = 10  # a checkpoint is healthy only after this many steps
    # without a skip, an open loss excursion or a critical level

    # --- QK-clip (qk_clip.py: per-head W_q, W_k scaled after the update) ---
    qk_clip: str = "always"  # at every probe pass, heads over qk_clip_tau (Kimi K2's
    # rule; on the rescue benchmark it saves as many as "off" and "watch", with lower final
    # losses and fewer steps lost, and never raised a healthy run's loss:
    # benchmarks/README.md); "watch": the same, only at level watch or above; "rescue":
    # from the first rescue on (a measure after the fact, beside rescue_lr's cap); "off"
    qk_clip_tau: float = 100.0  # largest pre-softmax logit a head may keep (Kimi K2 and
    # Megatron-Core's default: 100)

    def __post_init__(self) -> None:
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"GuardPolicy.{name} must be one of {choices}, got {getattr(self, name)!r}"
                )
        for name in _SWITCHES:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"GuardPolicy.{name} must be True or False, got {getattr(self, name)!r}"
                )
        for f in fields(self):
            if f.name in _CHOICES or f.name in _SWITCHES:
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"GuardPolicy.{f.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"GuardPolicy.{f.name} must be finite and >= 0, got {value!r}")
        multipliers = ("warn_lr", "critical_lr", "rescue_lr", "developed_rescue_lr")
        multipliers += ("jump_rescue_lr", "lr_fall")
        if self.warn_fall > 1:
            raise ValueError(
                f"GuardPolicy.warn_fall is an LR factor in (0, 1] (0: off), got {self.warn_fall!r}"
            )
        for name in (*multipliers, "lr_edge_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(
                    f"GuardPolicy.{name} is an LR factor in (0, 1], got {getattr(self, name)!r}"
                )
        if self.qk_clip_tau == 0:
            raise ValueError("GuardPolicy.qk_clip_tau must be > 0 (a logit bound), got 0")
        for name in ("lr_jump_ratio", "lr_lift"):
            if getattr(self, name) <= 1:
                raise ValueError(f"GuardPolicy.{name} must be > 1, got {getattr(self, name)!r}")
        if not 1 <= self.lr_jump_span <= max(1, self.lr_jump_steps):
            raise ValueError(
                "GuardPolicy.lr_jump_span must be in [1, lr_jump_steps] (steps a jump's rise "
                f"happens within), got {self.lr_jump_span!r} with lr_jump_steps="
                f"{self.lr_jump_steps!r}; 1 is a step change"
            )
        if self.keep_checkpoints < 1 or self.risk_every < 1:
            raise ValueError(
                "GuardPolicy.keep_checkpoints and risk_every must be >= 1, got "
                f"{self.keep_checkpoints} and {self.risk_every}"
            )

    def acting_level(self, level: Level) -> Level:
        """The level the guard's actions follow: ``level``, or OK with the forecast's
        actions off (``forecast_actions``: the reactive path alone)."""
        return level if self.forecast_actions else OK

    def level_lr(self, level: Level) -> float:
        """The LR multiplier a level asks for (1 below warn; 1 at warn when it holds)."""
        warn = 1.0 if self.warn_action == "hold" else self.warn_lr
        return {WARN: warn, CRITICAL: self.critical_lr}.get(self.acting_level(level), 1.0)

    def holds_lr(self, level: Level) -> bool:
        """Whether the LR is held at ``level`` (``warn_action="hold"``; warn_hold.py)."""
        return self.warn_action == "hold" and self.acting_level(level) >= WARN

    def level_clip(self, level: Level) -> float:
        """The global clipping bound at a level (0 = no clipping)."""
        level = self.acting_level(level)
        bound = {WARN: self.warn_clip, CRITICAL: self.critical_clip}.get(level, self.clip)
        return min(bound, self.clip) if self.clip > 0 else bound

    def releases_hold(self, level: Level) -> bool:
        """Whether the warn's hold may rise at ``level``: under ``hold_release``."""
        return self.acting_level(level) < Level(self.hold_release)

    def attention_every(self, level: Level, base: int) -> int:
        """The probe's attention period at a level: watch_attention_every at watch or
        above, else the probe's own ``base``."""
        return self.watch_attention_every if level > OK else base

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> GuardPolicy:
        reject_unknown_keys(cls, values)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def policy_keyword(policy: Any, config: Any, *, who: str = "Guard", stacklevel: int = 4) -> Any:
    """The value of ``policy=``, or of ``config=``, its deprecated old name (for ``who``)."""
    if config is None:
        return policy
    if policy is not None:
        raise TypeError(f"{who}: pass policy= alone (config= is its deprecated old name)")
    warnings.warn(
        f"{who}(config=...) is deprecated: pass the same value as {who}(policy=...)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return config


def resolve_policy(
    policy: GuardPolicy | Mapping[str, Any] | None, config: GuardPolicy | Mapping[str, Any] | None
) -> GuardPolicy:
    """``Guard(policy=...)``'s policy; ``config=`` is its old name (deprecated)."""
    policy = policy_keyword(policy, config)
    if isinstance(policy, Mapping):
        policy = GuardPolicy.from_dict(policy)
    policy = policy or GuardPolicy()
    if not isinstance(policy, GuardPolicy):
        raise TypeError(f"policy must be a GuardPolicy or a mapping, got {type(policy).__name__}")
    return policy
