"""The guard's parts on their own: the policy keyword, typed risk sources, the run state's
fields in a checkpoint, the deferred path's one rule set and its check."""

from __future__ import annotations

import math

import pytest
import torch
from guard_helpers import tiny_model

from collapse_guard.guard import Guard, GuardPolicy, ServiceRisk
from collapse_guard.guard.decision import GuardDecision, StepFacts, accepts_outliers, outlier_z
from collapse_guard.guard.deferred import DeferredMismatch, DeferredSync, SettledStep
from collapse_guard.guard.qk_clip import QKClip
from collapse_guard.guard.state import RunState
from collapse_guard.predictor.core.levels import CRITICAL, OK, WARN, WATCH, Level


def test_config_is_the_deprecated_name_of_policy(tmp_path):
    model, opt = tiny_model()
    with pytest.warns(DeprecationWarning, match=r"Guard\(policy=\.\.\.\)"):
        guard = Guard(model, opt, tmp_path, risk="off", config={"clip": 0.5}, record=False)
    assert guard.policy == GuardPolicy(clip=0.5)
    guard.close()
    with pytest.raises(TypeError, match="policy= alone"):
        Guard(model, opt, tmp_path, risk="off", policy={}, config={}, record=False)


def test_a_service_risk_carries_its_token_and_timeout(monkeypatch):
    import collapse_guard.service.client as client_module

    made = {}
    monkeypatch.setattr(client_module, "RiskClient", lambda url, **kw: made.update(url=url, **kw))
    ServiceRisk("http://host:1", token="t0k", timeout=0.5).client()
    assert made == {"url": "http://host:1", "token": "t0k", "timeout": 0.5, "top_k": 0}


def test_the_run_state_goes_into_a_checkpoint_by_its_fields_and_comes_back():
    run = RunState.fresh(GuardPolicy())
    run.level, run.qk_pending, run.events = WARN, {"a": ([0.5], [1.0])}, [(3, "skip:x")]
    run.loop_lrs.extend([1e-3, 2e-3])
    run.skip_streak = 2  # for this process only: not in the checkpoint
    state = run.state_dict()
    assert state["level"] == "warn" and type(state["level"]) is str  # weights_only loads it
    assert "skip_streak" not in state and state["loop_lrs"] == [1e-3, 2e-3]
    back = RunState.fresh(GuardPolicy())
    back.load_state_dict(state)
    assert back.level is WARN and back.qk_pending == run.qk_pending and back.skip_streak == 0
    assert back.loop_lrs.maxlen == run.loop_lrs.maxlen and list(back.loop_lrs) == [1e-3, 2e-3]
    del state["qk_clips"], state["qk_pending"]  # a checkpoint from before QK-clip
    back.load_state_dict(state)
    del state["rescues"]
    with pytest.raises(KeyError):
        back.load_state_dict(state)


def test_the_outlier_rules_are_one_for_the_host_and_the_device():
    policy = GuardPolicy()
    assert outlier_z(CRITICAL, policy) == policy.critical_outlier_z
    assert outlier_z(WATCH, policy) == policy.outlier_z
    assert accepts_outliers(policy.max_outlier_skips, False, policy)
    assert not accepts_outliers(policy.max_outlier_skips, True, policy)  # data-fault mode


def test_a_disagreement_of_the_devices_gate_and_the_host_is_an_error():
    sync = DeferredSync(GuardPolicy(), None, [], None, qk=False)
    settled = SettledStep(torch.zeros(1), 2.0, 1.0, False, {}, {}, 1e-3, 1e-3)
    sync.check(settled, GuardDecision(step=4))  # applied on both sides
    with pytest.raises(DeferredMismatch, match="step 4: the device's gate applied"):
        sync.check(settled, GuardDecision(step=4, apply_update=False, events=("skip:x",)))


def test_qk_clip_says_when_it_acts():
    model, _ = tiny_model()
    modes = {mode: QKClip(model, 100.0, mode=mode) for mode in ("always", "watch", "rescue")}
    assert modes["always"].acts(OK, 0)
    assert not modes["watch"].acts(OK, 0) and modes["watch"].acts(WATCH, 0)
    assert not modes["rescue"].acts(CRITICAL, 0) and modes["rescue"].acts(OK, 1)
    assert modes["always"].plan_after(None, OK, 0) == {}  # no probe pass this step


def test_a_level_name_in_the_facts_becomes_its_level():
    facts = StepFacts(step=0, loss=1.0, grad_norm=1.0, level="critical")
    assert facts.level is Level.CRITICAL and facts.level >= WARN
    assert math.isnan(facts.loss_z)
