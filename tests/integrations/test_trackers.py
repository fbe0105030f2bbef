"""The guard's numbers sent on by ``Trackers`` from a plain loop: a callable, a real
TensorBoard ``SummaryWriter`` read back from its event file, and a real MLflow run in a
SQLite store; a tracker that raises is dropped with one warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from collapse_guard.errors import UserInputError
from collapse_guard.guard import Guard
from collapse_guard.guard.trackers import Trackers

ACTIONS = ("skip", "rescue", "checkpoint", "qk_clip")


def tiny_guard(folder, **guard_kwargs) -> Guard:
    """A guard on a seeded 2-layer MLP with AdamW (lr 1e-2, constant)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return Guard(model, optimizer, folder, preflight=False, **guard_kwargs)


def guarded_run(guard: Guard, trackers: Trackers, steps: int, actions=None) -> Guard:
    """``steps`` seeded batches of a linear target, ``trackers.log(guard)`` after each
    step; ``actions``: step -> forced action. Returns the guard, closed."""
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        if step in (actions or {}):
            guard.force_next(actions[step])
        x = torch.randn(8, 8, generator=generator)
        loss = torch.nn.functional.mse_loss(guard.model(x), x.sum(dim=1, keepdim=True))
        loss.backward()
        guard.step(loss)
        guard.optimizer.zero_grad()
        trackers.log(guard)
    guard.close()
    return guard


class Sink:
    """A callable tracker that keeps what it got, beside the guard's own state then."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.got: list[tuple[int, dict[str, float]]] = []
        self.state: list[tuple[int, dict]] = []

    def __call__(self, metrics, step: int) -> None:
        self.got.append((step, dict(metrics)))
        self.state.append((self.guard.run.level.rank, self.guard.summary()))


def test_every_tenth_step_sends_the_risk_level_lr_scale_and_action_counts(tmp_path):
    sink = Sink(tiny_guard(tmp_path))  # the embedded risk model
    actions = {3: "skip", 5: "checkpoint"}
    guard = guarded_run(sink.guard, Trackers(sink), steps=30, actions=actions)  # every 10
    assert [step for step, _ in sink.got] == [10, 20, 30]
    readings = guard.run.risk_readings  # the windows of steps 9 and 19, heard a step later
    assert [step for step, _ in readings] == [9, 19]
    # step 10's log comes before the first reading is heard (at step 11): no risk yet
    assert "guard/risk" not in sink.got[0][1]
    assert sink.got[1][1]["guard/risk"] == readings[0][1]
    assert sink.got[2][1]["guard/risk"] == readings[1][1]
    for (_, metrics), (level, summary) in zip(sink.got, sink.state, strict=True):
        assert metrics["guard/level"] == level
        assert metrics["guard/actions/skip"] == 1.0 == summary["skipped"]
        assert metrics["guard/actions/rescue"] == 0.0
        # the forced one at step 5, and one at `watch` where the embedded model reads it
        assert 1.0 <= metrics["guard/actions/checkpoint"] == summary["checkpoints"]
        assert metrics["guard/actions/qk_clip"] == 0.0  # an MLP: no attention to clip
        assert set(metrics) - {"guard/risk"} == {
            "guard/level", "guard/lr_scale", *(f"guard/actions/{a}" for a in ACTIONS)
        }  # fmt: skip


def test_a_rescue_shows_as_a_count_and_as_the_lr_scale_its_cap_sets(tmp_path):
    got = []
    trackers = Trackers(lambda metrics, step: got.append((step, dict(metrics))), every=5)
    actions = {1: "checkpoint", 2: "checkpoint", 7: "rescue"}
    config = {"rescue_lr": 0.5, "skip_batches": 0}
    guarded_run(tiny_guard(tmp_path, risk="off", policy=config), trackers, 15, actions)
    by_step = {step: metrics for step, metrics in got}
    assert sorted(by_step) == [5, 10, 15]
    # before: the loop's own LR (risk off: level ok, multiplier 1); after: capped at 0.5x
    # the checkpoint's LR, the loop's constant 1e-2
    assert by_step[5]["guard/lr_scale"] == 1.0 and by_step[5]["guard/actions/rescue"] == 0
    assert by_step[10]["guard/lr_scale"] == pytest.approx(0.5, rel=1e-12)
    assert by_step[10]["guard/actions/rescue"] == 1.0 == by_step[15]["guard/actions/rescue"]
    assert all(m["guard/level"] == 0.0 and "guard/risk" not in m for m in by_step.values())


def test_a_tracker_that_raises_is_dropped_with_one_warning_and_the_others_go_on(tmp_path):
    calls, got = [], []

    def broken(metrics, step):
        calls.append(step)
        raise ConnectionError("tracking server gone")

    trackers = Trackers([broken, lambda m, s: got.append(s)], every=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guard = guarded_run(tiny_guard(tmp_path, risk="off"), trackers, steps=8)
    mine = [w for w in caught if "tracker" in str(w.message)]
    assert len(mine) == 1 and mine[0].category is RuntimeWarning
    assert "broken failed at step 2 (ConnectionError: tracking server gone)" in str(mine[0].message)
    assert calls == [2] and got == [2, 4, 6, 8] and guard.summary()["steps"] == 8


@pytest.mark.parametrize(
    ("spec", "every", "says"),
    [
        ("wandb", 10, r"unknown tracker 'wandb'; the named ones are \['mlflow'\]"),
        (42, 10, r"got 42 \(int\); pass \"mlflow\" .* or a callable \(metrics, step\)"),
        ([print, 3.5], 10, r"got 3.5 \(float\)"),
        ("mlflow", 0, r"every must be a whole number of steps >= 1, got 0"),
    ],
)
def test_a_wrong_tracker_or_cadence_says_what_is_expected(spec, every, says):
    with pytest.raises(UserInputError, match=says):
        Trackers(spec, every=every)


def test_a_summary_writer_gets_the_scalars_read_back_from_its_event_file(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    guard = guarded_run(tiny_guard(tmp_path / "guard"), Trackers(writer), 20, {3: "skip"})
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"guard/risk", "guard/level", "guard/lr_scale", "guard/actions/skip"} <= tags
    skips = [(e.step, e.value) for e in events.Scalars("guard/actions/skip")]
    assert skips == [(10, 1.0), (20, 1.0)]
    (risk,) = events.Scalars("guard/risk")  # heard at step 11: logged at 20 only
    assert risk.step == 20
    assert risk.value == pytest.approx(guard.run.risk_readings[0][1], rel=1e-6)  # float32


@pytest.mark.slow  # the store's schema migration: 5-25 s on a shared machine
def test_an_active_mlflow_run_gets_the_numbers_with_steps_and_none_is_started(
    tmp_path, active_store
):
    import mlflow

    mlflow_uri = active_store
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.create_experiment("guarded", artifact_location=tmp_path.as_uri())
    guarded_run(tiny_guard(tmp_path / "no-run"), Trackers([]), steps=10)  # the guard: MLflow
    assert mlflow.active_run() is None and client.search_runs([experiment]) == []
    with mlflow.start_run(experiment_id=experiment) as run:
        guard = guarded_run(tiny_guard(tmp_path / "run"), Trackers([]), 30, {3: "skip"})
    run_id = run.info.run_id
    skips = client.get_metric_history(run_id, "guard/actions/skip")
    assert sorted((m.step, m.value) for m in skips) == [(10, 1.0), (20, 1.0), (30, 1.0)]
    risk = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "guard/risk"))
    readings = guard.run.risk_readings
    assert risk == [(20, pytest.approx(readings[0][1])), (30, pytest.approx(readings[1][1]))]
    logged = client.get_run(run_id).data.metrics
    assert logged["guard/level"] == guard.run.level.rank and logged["guard/lr_scale"] > 0


def test_the_guards_own_trackers_send_at_its_risk_cadence_what_a_loop_would(tmp_path):
    got_by_hand, got_by_guard = [], []
    by_hand = tiny_guard(tmp_path / "a", trackers=[])
    guarded_run(by_hand, Trackers(lambda m, s: got_by_hand.append((s, m))), steps=30)
    by_guard = tiny_guard(tmp_path / "b", trackers=lambda m, s: got_by_guard.append((s, m)))
    guarded_run(by_guard, Trackers([]), steps=30)  # the guard logs: nothing by hand
    assert [s for s, _ in got_by_guard] == [10, 20, 30]
    assert got_by_guard == got_by_hand  # the same numbers at the same steps
