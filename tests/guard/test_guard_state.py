"""Checkpoints (atomic, weights_only, averaged), resume, and the service fallback."""

from __future__ import annotations

import math
import socket
import warnings

import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard
from collapse_guard.guard.checkpoints import CheckpointRing, CorruptCheckpoint, load_checkpoint
from collapse_guard.runfiles import read_run


def _train(guard, model, opt, loop, steps):
    for _ in range(steps):
        guard.step(loop.loss(model))
        opt.zero_grad()


def test_rollback_averages_the_last_three_checkpoints_exactly(tmp_path):
    ring = CheckpointRing(tmp_path, keep=3)
    states = []
    for step, value in enumerate((1.0, 2.0, 4.0, 8.0)):
        model = {"w": torch.full((2, 3), value), "count": torch.tensor(step)}
        optimizer = {"state": {}, "param_groups": [{"lr": value}]}
        ring.save(step, {"model": model, "optimizer": optimizer, "guard": {}})
        states.append(model)
    assert [p.name for p in ring.paths()] == [f"guard-00000000{i}.pt" for i in (1, 2, 3)]
    state = ring.rollback_state()
    # the oldest (1.0) left the ring: (2 + 4 + 8) / 3
    assert torch.equal(state["model"]["w"], torch.full((2, 3), 14.0 / 3))
    assert state["model"]["count"].item() == 3  # integer buffers from the newest
    assert state["optimizer"]["param_groups"][0]["lr"] == 8.0  # optimizer state: the newest
    assert state["averaged"] == 3 and state["step"] == 3


def test_the_ring_never_uses_nor_deletes_another_runs_checkpoints(tmp_path):
    other = CheckpointRing(tmp_path, keep=1)
    other.save(500, {"model": {"w": torch.zeros(1)}})
    ring = CheckpointRing(tmp_path, keep=1)
    with pytest.raises(FileNotFoundError, match="no healthy checkpoint"):
        ring.rollback_state()
    ring.save(3, {"model": {"w": torch.ones(1)}})
    ring.save(4, {"model": {"w": torch.full((1,), 3.0)}})
    assert [p.name for p in ring.paths()] == ["guard-000000004.pt"]
    assert (tmp_path / "guard-000000500.pt").exists()
    assert ring.rollback_state()["model"]["w"].item() == 3.0


def test_checkpoints_load_with_weights_only_and_refuse_pickled_code(tmp_path):
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off")
    _train(guard, model, opt, Loop(), 12)  # the first healthy step (10) writes one
    guard.close()
    path = guard.ring.newest()
    raw = torch.load(path, weights_only=True)  # plain tensors and values only
    assert raw["step"] == 11 and raw["guard"]["run"]["step_index"] == 11  # after step 10
    assert not list(tmp_path.glob("*.tmp"))  # written by temp + rename
    evil = tmp_path / "guard-000000099.pt"
    torch.save({"format": 1, "x": Loop()}, evil)
    with pytest.raises(CorruptCheckpoint, match=r"guard-000000099.pt: refused.*could run code"):
        load_checkpoint(evil)


def test_resume_keeps_the_guards_history(tmp_path):
    model, opt = tiny_model()
    loop = Loop()
    guard = Guard(model, opt, tmp_path, risk="off", policy={"checkpoint_every": 25})
    _train(guard, model, opt, loop, 40)
    guard.force_next("checkpoint")
    _train(guard, model, opt, loop, 1)  # step 40 writes one
    saved_state, saved_params = guard.state_dict(), [p.detach().clone() for p in model.parameters()]
    guard.close()

    model2, opt2 = tiny_model(seed=5)  # other weights: the resume must replace them
    guard2 = Guard(model2, opt2, tmp_path, risk="off", policy={"checkpoint_every": 25})
    assert guard2.resume() == 41
    assert all(torch.equal(a, b) for a, b in zip(saved_params, model2.parameters(), strict=True))
    events = guard2.state_dict()["run"]["events"]
    assert events == [*saved_state["run"]["events"], [41, "resume:guard-000000041.pt"]]
    assert list(guard2.loss_history.values) == saved_state["trajectory"]["loss_history"]["values"]
    assert len(guard2.window) == 41
    assert opt2.state_dict()["state"][0]["step"] == 41  # AdamW's count came back too
    _train(guard2, model2, opt2, loop, 3)  # and it trains on from step 41
    assert guard2.step_index == 44
    guard2.close()
    # the records: a new run file that goes on from step 41 and names the run it continues
    first, first_meta = read_run(guard.run_path)
    second, meta = read_run(guard2.run_path)
    assert guard2.run_path != guard.run_path
    assert meta.extra["continues"] == {
        "run_id": guard.run_id,
        "step": 41,
        "checkpoint": "guard-000000041.pt",
    }
    assert first["step"].tolist() == list(range(41)) and second["step"].tolist() == [41, 42, 43]
    assert meta.source == first_meta.source == "guarded"
    assert meta.extra["guard"]["events"][-1] == "41:resume:guard-000000041.pt"


def test_a_checkpoint_whose_run_context_another_version_saved_resumes_rebuilt(tmp_path):
    model, opt = tiny_model()
    loop = Loop()
    guard = Guard(model, opt, tmp_path, record=False)  # the bundled model: a run context
    _train(guard, model, opt, loop, 30)
    state = guard.state_dict()
    now = guard.trajectory.context.get()
    guard.close()
    old = state["trajectory"]["context"]  # the 13 slots a run kept before issue 34
    old["run"] = old["run"][:13]
    back = Guard(model, opt, tmp_path / "b", record=False)
    with pytest.warns(RuntimeWarning, match="rebuilt from the 30 steps of its risk window"):
        back.load_state_dict(state)
    rebuilt = back.trajectory.context
    assert rebuilt.step == 29
    # the window holds every step of this run: the rebuilt context is the one it replaced
    assert rebuilt.get() == pytest.approx(now, nan_ok=True)
    _train(back, model, opt, loop, 3)  # and the run goes on
    assert back.step_index == 33
    back.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the block ends: nothing listens there


def test_a_service_that_is_down_falls_back_to_the_bundled_model(tmp_path, risk_model):
    from collapse_guard.service.client import RiskClient

    client = RiskClient(f"http://127.0.0.1:{_closed_port()}", timeout=0.5)
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk=client, policy={"risk_every": 5})
    guard.risk.fallback.model = risk_model  # the session's copy: no second 4 s load
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop = Loop()
        for _ in range(60):
            guard.step(loop.loss(model))
            opt.zero_grad()
    guard.close()
    failed = [w for w in caught if "risk service failed" in str(w.message)]
    assert len(failed) == 1  # warned once, though every request failed
    assert guard.step_index == 60  # training went on
    assert guard.risk_source == "fallback" and guard.risk.failures >= 1


class _GarbageClient:
    """A service stand-in that answers a probability of 7 (garbage)."""

    def __init__(self) -> None:
        self.calls = 0

    def risk(self, frame, run_id="run", context=None):
        from types import SimpleNamespace

        self.calls += 1
        return SimpleNamespace(probability=7.0, level="ok")

    def ready(self) -> bool:
        return True


def test_a_garbage_answer_falls_back_too(tmp_path, risk_model):
    import time

    from collapse_guard.guard.risk_source import EmbeddedRisk, ServiceSource

    client = _GarbageClient()
    source = ServiceSource(client, EmbeddedRisk(risk_model))
    frame = __import__("pandas").DataFrame({"step": range(30), "loss": [2.5] * 30})
    with pytest.warns(RuntimeWarning, match="garbage answer"):
        source.submit(29, frame, None)
        for _ in range(100):  # the worker answers in the background
            reading = source.poll()
            if reading is not None:
                break
            time.sleep(0.01)
    assert reading.source == "fallback" and 0.0 <= reading.probability <= 1.0
    source.close()


def test_amp_grad_scaler_is_unscaled_stepped_and_updated(tmp_path):
    model, opt = tiny_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    guard = Guard(model, opt, tmp_path, scaler=scaler, risk="off")
    loop = Loop()
    for step in range(12):
        x, y = loop.next()
        _, loss = model(x, y)
        scaler.scale(loss).backward()
        if step == 11:  # an overflow: the scaler skips the step and halves its scale
            next(model.parameters()).grad[0, 0] = math.inf
        before = [p.detach().clone() for p in model.parameters()]
        decision = guard.step(loss)
        opt.zero_grad()
        moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        assert moved == (step < 11)
        assert decision.apply_update  # the overflow is the scaler's own skip, not the guard's
    assert scaler.get_scale() == 2.0**9 and guard.skipped == 0
    guard.close()
