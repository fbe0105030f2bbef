"""Each action of the guard on a real tiny model: skips, LR multiplier, clipping, rescue."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard, GuardGaveUp, GuardPolicy, warmup_cosine
from collapse_guard.runfiles import read_run


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_nonfinite_gradient_skips_the_update_and_is_recorded(tmp_path):
    model, opt = tiny_model()
    loop, guard = Loop(), Guard(model, opt, tmp_path, risk="off")
    for _ in range(5):
        guard.step(loop.loss(model))
        opt.zero_grad()
    before = params(model)
    loss = loop.loss(model)
    next(model.parameters()).grad[0, 0] = math.nan
    decision = guard.step(loss)
    assert decision.skipped and decision.reason == "nonfinite_grad"
    assert same(before, params(model))  # nothing moved, the optimizer state neither
    guard.close()
    frame, meta = read_run(guard.run_path)
    assert meta.source == "guarded" and len(frame) == 6
    assert frame["event"].iloc[-1] == "skip:nonfinite_grad"
    assert meta.extra["guard"]["skipped"] == 1


def test_a_gradient_spike_is_an_outlier_and_is_skipped(tmp_path):
    model, opt = tiny_model()
    loop, guard = Loop(), Guard(model, opt, tmp_path, risk="off")
    for _ in range(40):
        assert guard.step(loop.loss(model)).apply_update
        opt.zero_grad()
    before = params(model)
    loss = loop.loss(model)
    for p in model.parameters():
        p.grad.mul_(1e3)  # a bad reduction: the norm is ~1000x its history (z >> 6)
    decision = guard.step(loss)
    assert decision.skipped and decision.reason.startswith("grad_z=")
    assert same(before, params(model))
    guard.close()


def _sgd_step_scale(tmp_path, set_lr_every_step: bool, level: str, fixed_risk) -> list[float]:
    """Ratio of each step's parameter change to lr x grad (SGD: exactly the multiplier)."""
    torch.manual_seed(0)
    model, _ = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = None if set_lr_every_step else warmup_cosine(opt, 5, 200)
    no_clip = {"clip": 0.0, "warn_clip": 0.0, "critical_clip": 0.0}
    # "scale": warn's multiplier (the default holds the LR instead: test_warn_hold.py)
    policy = GuardPolicy(risk_every=1, critical_outlier_z=100.0, warn_action="scale", **no_clip)
    guard = Guard(model, opt, tmp_path, risk=fixed_risk(level), policy=policy)
    loop, ratios = Loop(), []
    for _ in range(30):
        if set_lr_every_step:  # nanoGPT: the loop writes the LR itself every step
            for group in opt.param_groups:
                group["lr"] = 0.1
        loss = loop.loss(model)
        w = model.head.weight
        before, grad, lr = w.detach().clone(), w.grad.detach().clone(), opt.param_groups[0]["lr"]
        decision = guard.step(loss)
        assert decision.apply_update
        ratios.append(((before - w.detach()) / (lr * grad)).nanmedian().item())
        assert opt.param_groups[0]["lr"] == lr  # the loop's own LR is put back
        opt.zero_grad()
        if scheduler:
            scheduler.step()
    guard.close()
    return ratios


@pytest.mark.parametrize("set_lr_every_step", [True, False], ids=["nanogpt-loop", "scheduler"])
def test_the_lr_multiplier_holds_at_every_step(tmp_path, fixed_risk, set_lr_every_step):
    ratios = _sgd_step_scale(tmp_path, set_lr_every_step, "warn", fixed_risk)
    # the first reading is asked after step 0 and applies from step 1 on
    assert ratios[0] == pytest.approx(1.0, rel=1e-4)
    assert ratios[1:] == pytest.approx([0.5] * 29, rel=1e-4)
    ratios = _sgd_step_scale(tmp_path / "c", set_lr_every_step, "critical", fixed_risk)
    assert ratios[1:] == pytest.approx([0.25] * 29, rel=1e-4)


def test_warn_tightens_the_global_clip(tmp_path, fixed_risk):
    model, _ = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: only the gradients matter
    guard = Guard(model, opt, tmp_path, risk=fixed_risk("warn"), policy={"risk_every": 1})
    loop = Loop()
    guard.step(loop.loss(model))  # reading asked here, applies next step
    opt.zero_grad()
    loss = loop.loss(model)
    for p in model.parameters():
        p.grad.mul_(4.0 / guard.history.norms[0].norm())  # a norm of ~4, over the 0.5 bound
    guard.step(loss)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert norm.item() == pytest.approx(0.5, rel=1e-4)
    guard.close()


def test_a_persistent_nonfinite_loss_is_rescued_then_the_guard_gives_up(tmp_path):
    model, opt = tiny_model()
    loop = Loop()
    guard = Guard(model, opt, tmp_path, risk="off", policy={"max_rescues": 2})
    for _ in range(12):
        guard.step(loop.loss(model))
        opt.zero_grad()
    streak = guard.policy.max_skip_streak
    for rescue in range(2):  # the first losses of a streak are skipped, the last one rescued
        decisions = []
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            for _ in range(streak):
                loop.loss(model)
                decisions.append(guard.step(torch.tensor(math.nan)))
                opt.zero_grad()
        assert [d.rescue for d in decisions] == [False] * (streak - 1) + [True]
        assert all(d.skipped for d in decisions)
        # back after a rollback to finite weights: the forward overflows, and the user
        # hears what a lower LR cannot mend
        again = [str(w.message) for w in said if "non-finite again" in str(w.message)]
        assert len(again) == rescue and all("Train in bf16" in text for text in again)
    # each rescue halves the cap: 1/2 of the checkpoint's LR, then 1/2 of that
    assert guard.lr_ceiling == pytest.approx(0.25 * 3e-3) and guard.pending_skips == 40
    with pytest.raises(GuardGaveUp, match="after 2 rescues"):
        for _ in range(streak):
            loop.loss(model)
            guard.step(torch.tensor(math.nan))
    assert guard.run_path.exists()  # closed on the way out: the evidence is on disk


def test_batches_skips_what_a_rescue_asked(tmp_path):
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off", policy={"skip_batches": 7})
    guard.pending_skips = 7
    assert list(guard.batches(range(10))) == [7, 8, 9]
    assert not guard.should_skip_batch()
    guard.close()


def test_an_injected_nan_weight_is_rescued_and_the_run_finishes_healthy(tmp_path):
    model, opt = tiny_model(seed=1)
    loop = Loop(seed=1)
    guard = Guard(model, opt, tmp_path, risk="off", policy={"checkpoint_every": 20})
    losses = []
    for step in range(150):
        if step == 90:
            with torch.no_grad():
                model.head.weight[0, 0] = math.nan  # a corrupted weight: every loss is NaN
        loss = loop.loss(model)
        decision = guard.step(loss)
        opt.zero_grad()
        losses.append(loss.item())
        if step in (90, 91):  # skipped: a single non-finite loss may be one batch's
            assert decision.skipped and not decision.rescue
        if step == 92:  # the third in a row: the weights broke
            assert decision.rescue and decision.reason == "nonfinite_loss"
            # the ring's recorded losses 2.19, 1.45, 1.15 (steps 31, 51, 71): still falling
            # fast, no two within average_loss_gap (5%), so the newest alone
            assert [p[-9:] for p in decision.rollback_to] == ["000071.pt"]
    guard.close()
    assert all(math.isfinite(x) for x in losses[93:])
    assert sum(losses[-10:]) / 10 < sum(losses[80:90]) / 10 + 0.1  # back where it was
    forensics = tmp_path / "forensics" / "step-000000092"
    assert (forensics / "grad_history.npz").exists() and (forensics / "grad_history.png").exists()
    import numpy as np

    saved = np.load(forensics / "grad_history.npz")
    assert saved["norms"].shape == (93, len(guard.param_names))
    assert saved["counts"].shape[0] == len(guard.param_names)


@pytest.mark.slow  # 260 steps: 6-8 s on the loaded machine
def test_a_large_lr_collapse_is_rescued(tmp_path):
    """The LR jumps to 100x (0.3) at step 60: the guard rolls back and lowers the LR."""
    model, opt = tiny_model(seed=2)
    loop = Loop(seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        guard = Guard(model, opt, tmp_path, risk="off", policy={"checkpoint_every": 20})
    losses = []
    for step in range(260):
        for group in opt.param_groups:
            group["lr"] = 3e-3 if step < 60 else 0.3
        loss = loop.loss(model)
        guard.step(loss)
        opt.zero_grad()
        losses.append(loss.item())
    guard.close()
    healthy = sum(losses[50:60]) / 10
    assert guard.rescues >= 1
    assert sum(losses[-20:]) / 20 < healthy + 0.25, (healthy, losses[-20:])


def test_a_rescue_caps_the_lr_while_the_loop_keeps_raising_it(tmp_path):
    """nanoGPT's loop sets a rising LR every step; after a rescue the LR in force stays at
    half the LR of the checkpoint rolled back to, and the loop's own LR is left alone."""
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off")
    loop, in_force = Loop(), []
    for step in range(30):
        for group in opt.param_groups:
            group["lr"] = 1e-4 * (1 + step)  # a re-warm: 10% more every 10 steps or so
        if step == 15:
            guard.force_next("rescue")
        guard.step(loop.loss(model))
        opt.zero_grad()
        in_force.append(guard.lr_in_force)
        assert opt.param_groups[0]["lr"] == pytest.approx(1e-4 * (1 + step))
    # the first checkpoint holds step 10, whose LR was 1.1e-3: the cap is half of that
    assert guard.lr_ceiling == pytest.approx(0.5 * 1.1e-3)
    assert in_force[14] == pytest.approx(1.5e-3)  # before the rescue: the loop's LR
    assert in_force[16:] == pytest.approx([0.55e-3] * 14)  # after: capped, every step
    guard.close()


def test_watch_probes_attention_more_often_and_checkpoints(tmp_path, fixed_risk):
    model, opt = tiny_model()
    policy = {"risk_every": 1, "checkpoint_every": 0, "watch_checkpoint_gap": 5}
    guard = Guard(model, opt, tmp_path, risk=fixed_risk("watch"), policy=policy)
    loop = Loop()
    decisions = []
    for _ in range(30):
        decisions.append(guard.step(loop.loss(model)))
        opt.zero_grad()
    assert guard.probe.config.attention_every == 5  # ProbeConfig's 10, halved at watch
    steps = [d.step for d in decisions if d.checkpoint]
    # the first healthy step (10 quiet steps), then every 5 steps while at watch
    assert steps == [10, 15, 20, 25] and len(guard.ring.paths()) == 3
    guard.close()


def test_at_warn_an_outlier_tensor_is_clipped_to_five_times_its_median(tmp_path, fixed_risk):
    model, opt = tiny_model()
    policy = {"risk_every": 1, "clip": 0.0, "warn_clip": 0.0, "critical_clip": 0.0}
    guard = Guard(model, opt, tmp_path, risk=fixed_risk("warn"), policy=policy)
    loop = Loop()
    for _ in range(30):
        guard.step(loop.loss(model))
        opt.zero_grad()
    name = "blocks.0.ln_1.bias" if "blocks.0.ln_1.bias" in guard.param_names else None
    name = name or next(n for n in guard.param_names if n.endswith("bias"))
    i = guard.param_names.index(name)
    median = torch.nanmedian(guard.history.norms[:30, i]).item()
    loss = loop.loss(model)
    tensor = guard.params[i]
    tensor.grad.mul_(50 * median / tensor.grad.norm())  # 50x its median: an outlier layer
    others = {n: p.grad.clone() for n, p in zip(guard.param_names, guard.params, strict=True)}
    decision = guard.step(loss)
    assert decision.apply_update and name in decision.clip_layers
    assert tensor.grad.norm().item() == pytest.approx(5 * median, rel=1e-3)
    # the other tensors' gradients are untouched (no global clip in this policy)
    for n, p in zip(guard.param_names, guard.params, strict=True):
        if n not in decision.clip_layers:
            assert torch.equal(p.grad, others[n]), n
    guard.close()


@pytest.mark.parametrize("collapse", ["developed", "nonfinite"])
def test_a_collapse_that_developed_is_capped_at_its_own_factor(tmp_path, collapse):
    model, opt = tiny_model()  # LR 3e-3 throughout: every checkpoint's LR
    config = {"rescue_lr": 0.5, "developed_rescue_lr": 0.25}
    guard = Guard(model, opt, tmp_path, risk="off", policy=config)
    loop = Loop()
    for step in range(200):
        loss = loop.loss(model)
        if step >= 70:  # developed: a loss that climbs and stays up (the label's rule)
            loss = loss + 0.05 * (step - 69) if collapse == "developed" else loss * math.nan
        guard.step(loss)
        opt.zero_grad()
        if guard.rescues:
            break
    reason = {"developed": "online_collapse", "nonfinite": "nonfinite_loss"}[collapse]
    assert [e for _, e in guard.events if e.startswith("rescue:")] == [f"rescue:{reason}"]
    factor = {"developed": 0.25, "nonfinite": 0.5}[collapse]
    assert guard.lr_ceiling == pytest.approx(factor * 3e-3)
    guard.close()
