"""The run file is durable at the checkpoint cadence, and a resumed run's lineage is on
disk before its first close (the in-process half of test_guard_kill.py)."""

from __future__ import annotations

from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard
from collapse_guard.runfiles import read_meta, read_run

EVERY_STEP = {"checkpoint_every": 1, "healthy_quiet_steps": 0}


def _steps(guard, model, opt, n, seed=0):
    loop = Loop(seed=seed)
    for _ in range(n):
        guard.step(loop.loss(model))
        opt.zero_grad()


def test_every_checkpoint_makes_the_rows_up_to_it_durable(tmp_path):
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off", policy=EVERY_STEP)
    _steps(guard, model, opt, 30)  # far fewer than the writer's 256-row chunk
    # not closed: what a SIGKILL now would leave on disk
    frame = read_run(guard.run_path)[0]
    assert frame["step"].tolist() == list(range(30))
    assert guard.ring.newest().name == "guard-000000030.pt"  # the state after step 29
    guard.close()


def test_a_resumed_runs_lineage_is_on_disk_from_its_first_chunk(tmp_path):
    model, opt = tiny_model()
    first = Guard(model, opt, tmp_path, risk="off", policy=EVERY_STEP)
    _steps(first, model, opt, 12)  # killed here: never closed
    model, opt = tiny_model(seed=3)
    second = Guard(model, opt, tmp_path, risk="off", policy=EVERY_STEP)
    assert second.resume() == 12
    _steps(second, model, opt, 3, seed=1)  # killed midway as well
    meta = read_meta(second.run_path)
    assert meta.extra["continues"] == {
        "run_id": first.run_id,
        "step": 12,
        "checkpoint": "guard-000000012.pt",
    }
    assert read_run(first.run_path)[0]["step"].tolist() == list(range(12))  # it names a file
    assert read_run(second.run_path)[0]["step"].tolist() == [12, 13, 14]
    second.close()
    first.close()
