"""The guard's per-step cost: its risk window scored through the array path (the same
risk as the frame path), and the host reads of a healthy step counted."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.features import RunContext
from collapse_guard.features.ring import SignalRing
from collapse_guard.guard import Guard
from collapse_guard.guard.risk_source import EmbeddedRisk
from collapse_guard.runfiles import read_run
from collapse_guard.signals import SIGNAL_NAMES


def test_the_ring_window_scores_as_its_frame_does(risk_model):
    rng = np.random.default_rng(0)
    ring = SignalRing(risk_model.schema.window, SIGNAL_NAMES)
    context = RunContext.from_schema(risk_model.schema)
    for step in range(260):  # past the ring's capacity: it has wrapped
        row = rng.lognormal(0.5, 0.3, len(SIGNAL_NAMES))
        row[rng.random(len(row)) < 0.3] = np.nan  # signals not measured at every step
        ring.append(step, row)
        context.update(step, dict(zip(SIGNAL_NAMES, map(float, row), strict=True)))
    window, ctx = ring.window(), context.get()
    reading = EmbeddedRisk(risk_model).score(259, window, ctx)
    assert reading.probability == risk_model.predict_window(window.frame(), context=ctx)
    assert 0.0 < reading.probability < 1.0


def test_the_guard_submits_its_ring_and_reads_a_risk_every_risk_every_steps(tmp_path, risk_model):
    model, optimizer = tiny_model()
    config = {"risk_every": 10}
    guard = Guard(model, optimizer, tmp_path, risk=risk_model, policy=config, preflight=False)
    loop = Loop()
    for _ in range(25):
        guard.step(loop.loss(model))
        optimizer.zero_grad()
    guard.close()
    assert [s for s, _ in guard.risk_readings] == [9, 19]
    assert len(guard.window) == 25 and guard.window.window().steps.tolist() == list(range(25))
    assert all(0.0 < p < 1.0 for _, p in guard.risk_readings)
    with pytest.raises(ValueError, match="at least one step"):
        SignalRing(0, SIGNAL_NAMES)


# ---------------------------------------------------------------- host reads
_READS = ("item", "tolist", "__float__", "__bool__", "__int__", "cpu", "nonzero")


class ReadCounter:
    """Counts the calls of torch.Tensor methods that read a value to the host (on a GPU
    each is a sync); ``per_step`` holds one count per guard.step."""

    def __init__(self, monkeypatch) -> None:
        self.now, self.per_step = 0, []
        for name in _READS:
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(real))

    def _counting(self, real):
        def counted(tensor, *args, **kwargs):
            self.now += 1
            return real(tensor, *args, **kwargs)

        return counted

    def step(self, guard: Guard, loss: torch.Tensor) -> None:
        self.now = 0
        guard.step(loss)
        self.per_step.append(self.now)


def _fused_run(tmp_path, sync: str, steps: int, counter=None, poison=None, **policy) -> Guard:
    """A guarded run with fused AdamW; ``poison(step, loss)`` may change a step's loss."""
    torch.manual_seed(0)
    model, _ = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    config = {"checkpoint_every": 1000, **policy}  # the first healthy checkpoint only
    guard = Guard(model, optimizer, tmp_path, risk="off", policy=config, sync=sync, preflight=False)
    loop = Loop()
    for step in range(steps):
        x, y = loop.next()
        _, loss = model(x, y)
        loss = poison(step, loss) if poison is not None else loss
        loss.backward()
        if counter is not None:
            counter.step(guard, loss)
        else:
            guard.step(loss)
        optimizer.zero_grad()
    return guard


def test_a_healthy_deferred_step_reads_nothing_to_the_host(tmp_path, monkeypatch):
    counter = ReadCounter(monkeypatch)
    _fused_run(tmp_path / "deferred", "deferred", 40, counter).close()
    deferred, counter.per_step = counter.per_step, []
    _fused_run(tmp_path / "step", "step", 40, counter).close()
    # read at every step (sync="step"), on the CPU value by value (free there; a device's
    # values go to the host in one stack): the guard's loss and norm (2 floats), the
    # probe's finiteness check of the norm and whether every tensor moved (2 bools; at
    # step 0 no update came before: 1) and the record's tensors (10 floats; 15 at step
    # 0, 17 with the attention pass of every 10th step; its head maxima for QK-clip come
    # to the host as one array, through numpy); step 10 checkpoints (healthy_quiet_steps
    # reached) and reads the parameters' finiteness too (.cpu(), bool)
    assert counter.per_step == [18] + [14] * 9 + [23] + [14] * 9 + ([21] + [14] * 9) * 2
    # deferred: nothing, but at the checkpoint, which reads its facts at once (as above);
    # the attention pass of every 10th step (its head maxima travel with the deferred
    # facts: the tiny GPT's heads stay at 0.03-0.6, under tau) and the sketch's set-up
    # read nothing either
    assert deferred == [0] * 10 + [23] + [0] * 29


def test_deferred_qk_clip_reads_at_once_only_the_steps_that_clip(tmp_path, monkeypatch):
    counter = ReadCounter(monkeypatch)
    # tau 0.01: every pass (steps 0, 10, 20, 30) has heads over it; the step after each
    # applies the plan after its update, so it reads its facts at once (14, as sync="step"
    # does, and 3 as the clip scales the heads), and only it
    guard = _fused_run(tmp_path, "deferred", 40, counter, qk_clip_tau=0.01)
    guard.close()
    read = [step for step, reads in enumerate(counter.per_step) if reads]
    assert read == [1, 10, 11, 21, 31]  # step 10: the checkpoint, as above
    assert [counter.per_step[s] for s in (1, 21, 31)] == [17] * 3
    assert sorted({s for s, e in guard.events if e.startswith("qk_clip:")}) == [1, 11, 21, 31]


def test_deferred_qk_clip_gives_the_same_run_as_read_at_once(tmp_path):
    runs = [
        _fused_run(tmp_path / sync, sync, 35, qk_clip_tau=0.01) for sync in ("step", "deferred")
    ]
    for guard in runs:
        guard.close()
    assert runs[0].qk_clips == runs[1].qk_clips > 0
    _same_run(*runs)  # the same factors, applied after the same updates


def _same_run(a: Guard, b: Guard) -> None:
    for p, q in zip(a.params, b.params, strict=True):
        assert torch.equal(p, q)
    assert a.events == b.events
    frame_a, _ = read_run(a.run_path)
    frame_b, _ = read_run(b.run_path)
    # the host's free memory is the machine's, read at two moments: not the run's
    differ = [c for c in frame_a if not frame_a[c].equals(frame_b[c])]
    assert set(differ) <= {"host_mem_available"}  # equal too when the machine was quiet


def test_deferred_facts_give_the_same_run_as_facts_read_at_once(tmp_path):
    def outlier(step, loss):
        return loss * 40.0 if step == 30 else loss  # a loss and gradient far out of band

    runs = [_fused_run(tmp_path / sync, sync, 45, poison=outlier) for sync in ("step", "deferred")]
    for guard in runs:
        guard.close()
    assert [(s, e[:11]) for s, e in runs[0].events if "skip" in e] == [(30, "skip:loss_z")]
    assert runs[0].skipped == runs[1].skipped == 1
    _same_run(*runs)  # bit for bit: parameters, events, every row of the run file


def test_deferred_nonfinite_losses_are_skipped_then_rescued_a_step_later(tmp_path):
    def nan_from_25(step, loss):
        return loss * math.nan if 25 <= step <= 27 else loss

    guard = _fused_run(tmp_path, "deferred", 32, poison=nan_from_25)
    guard.close()
    at = {step: [e for s, e in guard.events if s == step] for step in range(24, 30)}
    # a non-finite loss is read at its own step: skipped, the third in a row rescued
    assert at[24] == [] and at[25] == at[26] == ["skip:nonfinite_loss"]
    # booked at its own step (the rescue's events), acted on as step 28 begins: the
    # backward of step 28 ran at the weights the rollback replaced, so it trains nothing
    assert at[27][0] == "rescue:nonfinite_loss"
    assert any(e.startswith("rollback:") for e in at[27])
    assert at[28] == ["skip:after_rescue"] and at[29] == [] and guard.skipped == 3
    assert guard.rescues == 1 and guard.step_index == 32
    with pytest.raises(ValueError, match="fused=True"):
        Guard(*tiny_model(), tmp_path / "x", risk="off", sync="deferred", record=False)


def test_deferred_gating_agrees_with_the_host_through_accepts_and_an_online_collapse(tmp_path):
    def schedule(step, loss):
        if step in (40, 41, 42):  # two skips, then the outlier is accepted (it is the data)
            return loss * 30.0
        if step >= 70:  # a loss that climbs and stays up: the label's rule, run live
            return loss + 0.05 * (step - 69)
        return loss

    runs = [_fused_run(tmp_path / m, m, 150, poison=schedule) for m in ("step", "deferred")]
    events = []
    for guard in runs:
        guard.close()
        events.append(guard.events)
    rescue = [s for s, e in events[0] if e.startswith("rescue:online_collapse")]
    assert rescue == [122]  # the rise from step 70 stays over best + margin for 30 steps
    first = rescue[0]
    before = [[(s, e) for s, e in ev if s <= first] for ev in events]
    # the same skips, the same accept, the same collapse at the same step, then the
    # deferred run acts a step late: its next backward is discarded
    assert before[0] == before[1]
    assert (
        sum(e.startswith("skip:loss_z") or e.startswith("skip:grad_z") for _, e in before[0]) == 2
    )
    assert any(e.startswith("accept:") for s, e in before[0] if s == 42)
    assert (first + 1, "skip:after_rescue") in events[1]
