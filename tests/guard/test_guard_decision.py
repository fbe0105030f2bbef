"""The rules of decision.decide on hand-written facts: no model, no optimizer."""

import math

import pytest

from collapse_guard.guard import GuardDecision, GuardPolicy, StepFacts, decide
from collapse_guard.guard.decision import next_lr_multiplier

POLICY = GuardPolicy()


def facts(**kw) -> StepFacts:
    base = {"step": 50, "loss": 2.0, "grad_norm": 0.5, "quiet_steps": 100, "since_checkpoint": 5}
    return StepFacts(**{**base, **kw})


def test_a_healthy_step_is_applied_with_the_base_clip():
    d = decide(facts(), POLICY)
    assert d.apply_update and not d.rescue and not d.checkpoint
    assert d.clip_to == POLICY.clip and d.lr_multiplier == 1.0 and d.events == ()


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"grad_finite": False, "grad_norm": math.inf}, "nonfinite_grad"),
        ({"loss_z": 10.5}, "loss_z=10.5"),
        ({"grad_z": 12.0}, "grad_z=12.0"),
        ({"grad_z": 3.5, "level": "critical"}, "grad_z=3.5"),  # critical: z over 3 skips
    ],
)
def test_outliers_and_nonfinite_gradients_skip_the_update(kw, reason):
    d = decide(facts(**kw), POLICY)
    assert d.skipped and not d.rescue and d.reason == reason
    assert f"skip:{reason}" in d.events


def test_a_z_of_3_5_is_not_an_outlier_below_critical_nor_an_amp_overflow():
    assert decide(facts(grad_z=3.5, level="warn"), POLICY).apply_update
    assert decide(facts(loss_z=8.0), POLICY).apply_update  # OLMo-core's 6 would skip it
    overflow = facts(grad_finite=False, grad_norm=math.inf, amp_overflow=True)
    assert decide(overflow, POLICY).apply_update  # the GradScaler skips it itself


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"skip_streak": 2, "loss": math.nan}, "nonfinite_loss"),  # third non-finite
        ({"collapse_online": True}, "online_collapse"),
        ({"warned_rise": True}, "warn_rise"),  # the loss rises under the warn's hold
        ({"skip_streak": 2, "grad_finite": False}, "skip_streak=3"),  # third non-finite
    ],
)
def test_rescues(kw, reason):
    d = decide(facts(**kw), POLICY)
    assert d.rescue and d.skipped and d.reason == reason and not d.give_up


def test_one_nonfinite_loss_is_skipped_as_a_grad_scaler_skips_an_overflow():
    # fp16 without a scaler overflows on single batches; a rollback cannot stop that
    for streak in range(POLICY.max_skip_streak - 1):
        d = decide(facts(loss=math.nan, grad_finite=False, skip_streak=streak), POLICY)
        assert d.skipped and not d.rescue and d.events == ("skip:nonfinite_loss",)
    # never accepted as data, however long the streak of outliers before it was
    patient = GuardPolicy(max_skip_streak=POLICY.max_outlier_skips + 2)
    d = decide(facts(loss=math.nan, skip_streak=POLICY.max_outlier_skips), patient)
    assert d.skipped and not d.rescue and d.events == ("skip:nonfinite_loss",)


def test_a_rescue_past_the_cap_gives_up():
    streak = POLICY.max_skip_streak - 1
    d = decide(facts(loss=math.nan, skip_streak=streak, rescues=POLICY.max_rescues), POLICY)
    assert d.give_up and not d.rescue and d.events == ("give_up:nonfinite_loss",)


def test_levels_set_lr_and_clip_and_the_lr_comes_back_by_doubling():
    warn = decide(facts(level="warn"), POLICY)  # the default holds the LR (warn_hold.py)
    assert (warn.lr_multiplier, warn.clip_to) == (1.0, 0.5)
    warn = decide(facts(level="warn"), GuardPolicy(warn_action="scale"))
    assert (warn.lr_multiplier, warn.clip_to) == (0.5, 0.5)
    critical = decide(facts(level="critical"), POLICY)
    assert (critical.lr_multiplier, critical.clip_to) == (0.25, 0.25)
    # back at ok: 0.25 doubles in lr_restore_steps (100) steps, geometrically
    m = 0.25
    for _ in range(100):
        m = next_lr_multiplier(m, "ok", POLICY)
    assert m == pytest.approx(0.5)
    for _ in range(100):
        m = next_lr_multiplier(m, "ok", POLICY)
    assert m == 1.0


def test_outlier_layers_are_clipped_only_at_warn_and_above():
    kw = {"layer_outliers": ("h.0.attn.weight",)}
    assert decide(facts(**kw), POLICY).clip_layers == ()
    assert decide(facts(level="warn", **kw), POLICY).clip_layers == ("h.0.attn.weight",)


def test_checkpoints_when_due_or_at_watch_and_only_when_healthy():
    assert decide(facts(since_checkpoint=100), POLICY).checkpoint
    assert not decide(facts(since_checkpoint=99), POLICY).checkpoint
    assert decide(facts(since_checkpoint=20, level="watch"), POLICY).checkpoint
    assert decide(facts(since_checkpoint=20, held=True), POLICY).checkpoint  # at ok, held
    assert not decide(facts(since_checkpoint=19, held=True), POLICY).checkpoint
    assert not decide(facts(since_checkpoint=500, quiet_steps=9), POLICY).checkpoint
    assert not decide(facts(since_checkpoint=500, level="critical"), POLICY).checkpoint


def test_a_decision_round_trips_through_a_dict():
    d = decide(facts(level="warn", layer_outliers=("a",)), POLICY)
    assert GuardDecision.from_dict(d.to_dict()) == d


def test_policy_rejects_unknown_keys_and_bad_multipliers():
    with pytest.raises(ValueError, match="warn_lr"):
        GuardPolicy(warn_lr=1.5)
    with pytest.raises(ValueError):
        GuardPolicy.from_dict({"warn_lr": 0.5, "typo": 1})


def test_a_lasting_outlier_is_applied_after_two_skips_not_rescued():
    assert decide(facts(skip_streak=1, loss_z=11.0), POLICY).skipped
    third = decide(facts(skip_streak=2, loss_z=11.0), POLICY)
    assert third.apply_update and not third.rescue and third.events == ("accept:loss_z=11.0",)


def test_an_outlier_streak_right_after_an_lr_jump_is_rescued_not_accepted():
    d = decide(facts(skip_streak=2, loss_z=11.0, lr_jump=True), POLICY)
    assert d.rescue and d.reason == "lr_jump:loss_z=11.0"
    assert decide(facts(skip_streak=1, loss_z=11.0, lr_jump=True), POLICY).skipped  # not yet


def test_an_outlier_at_the_restored_weights_is_a_data_fault_skipped_without_limit():
    first = decide(facts(after_rollback=True, loss_z=12.0), POLICY)
    assert first.skipped and first.data_fault and "data_fault:loss_z=12.0" in first.events
    # in data-fault mode: never accepted, and the online collapse does not roll back
    later = decide(
        facts(data_fault=True, skip_streak=40, loss_z=12.0, collapse_online=True), POLICY
    )
    assert later.skipped and not later.rescue and later.data_fault
    nonfinite = facts(data_fault=True, loss=math.nan, skip_streak=POLICY.max_skip_streak - 1)
    assert decide(nonfinite, POLICY).rescue  # non-finite losses in a row still do
    # the mode ends after data_clear_steps clean batches in a row
    steps = POLICY.data_clear_steps
    assert decide(facts(data_fault=True, clean_steps=steps - 2), POLICY).data_fault
    clear = decide(facts(data_fault=True, clean_steps=steps - 1), POLICY)
    assert clear.apply_update and not clear.data_fault and "data_clear" in clear.events
    # a normal first batch after a rollback: no data fault
    assert not decide(facts(after_rollback=True, loss_z=1.0), POLICY).data_fault


def test_data_that_stays_bad_gives_up_at_max_data_fault_skips_in_a_row():
    limit = POLICY.max_data_fault_skips
    assert decide(facts(data_fault=True, skip_streak=limit - 2, loss_z=12.0), POLICY).skipped
    stop = decide(facts(data_fault=True, skip_streak=limit - 1, loss_z=12.0), POLICY)
    assert stop.give_up and stop.reason == f"data_fault_skips={limit}"
    assert stop.events == (f"give_up:data_fault_skips={limit}",)
    # a clean batch is no skip, outside the mode there is no such bound, 0 lifts it
    assert decide(facts(data_fault=True, skip_streak=limit - 1), POLICY).apply_update
    assert not decide(facts(skip_streak=limit - 1, loss_z=12.0), POLICY).give_up
    unbounded = GuardPolicy(max_data_fault_skips=0)
    assert decide(facts(data_fault=True, skip_streak=10**6, loss_z=12.0), unbounded).skipped


def test_an_outlier_at_the_rings_average_rolls_back_to_the_newest_not_a_data_fault():
    # a mean of checkpoints was never measured: it cannot tell the data from the model
    d = decide(facts(after_rollback=True, averaged_rollback=True, loss_z=12.0), POLICY)
    assert d.rescue and d.reason == "average_worse:loss_z=12.0" and not d.data_fault


def test_a_rise_under_the_hold_in_data_fault_mode_is_no_rescue():
    # bad data, not the model: rolling back cannot fix it (data-fault mode skips instead)
    d = decide(facts(warned_rise=True, data_fault=True), POLICY)
    assert not d.rescue and d.reason == ""
