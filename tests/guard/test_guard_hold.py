"""The guard acts on the risk held over its model's hold_steps, as the levels were set."""

from __future__ import annotations

from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard
from collapse_guard.guard.risk_source import ReadingHold, RiskReading


def test_a_reading_holds_its_level_for_hold_steps_steps():
    hold = ReadingHold()
    warn = hold(RiskReading(9, 0.9, "warn", "embedded", hold_steps=50))
    assert (warn.probability, warn.level) == (0.9, "warn")
    held = hold(RiskReading(19, 0.1, "ok", "embedded", hold_steps=50))
    assert (held.step, held.probability, held.level) == (19, 0.9, "warn")
    assert hold(RiskReading(58, 0.2, "ok", "embedded", hold_steps=50)).level == "warn"
    after = hold(RiskReading(59, 0.2, "ok", "embedded", hold_steps=50))
    assert (after.probability, after.level) == (0.2, "ok")  # step 9 left the window


def test_a_model_with_another_hold_starts_afresh_and_zero_holds_nothing():
    hold = ReadingHold()
    hold(RiskReading(9, 0.9, "warn", "service", hold_steps=50))
    fell_back = hold(RiskReading(19, 0.1, "ok", "embedded", hold_steps=0))
    assert (fell_back.probability, fell_back.level) == (0.1, "ok")


class FlickeringRisk:
    """A model stand-in: warn at its first reading, ok at every later one, held 50 steps."""

    hold_steps = 50

    def __init__(self, schema) -> None:
        self.schema, self.calls = schema, 0

    def predict_window(self, frame, context=None) -> float:
        self.calls += 1
        return 0.9 if self.calls == 1 else 0.1

    def level(self, p: float) -> str:
        return "warn" if p >= 0.5 else "ok"


def test_the_guard_stays_at_warn_while_the_hold_lasts(tmp_path, risk_model):
    model, opt = tiny_model()
    risk = FlickeringRisk(risk_model.schema)
    guard = Guard(model, opt, tmp_path, risk=risk, policy={"risk_every": 10})
    loop, levels = Loop(), []
    for _ in range(120):
        guard.step(loop.loss(model))
        opt.zero_grad()
        levels.append(guard.level)
    guard.close()
    # readings come for steps 9, 19, ...; the warn of step 9 applies from step 10 and is
    # held while step 9 is among the last 50 steps: until the reading of step 59 (raw,
    # the guard would have been back at ok from step 20)
    warned = [s for s, level in enumerate(levels) if level == "warn"]
    assert warned == list(range(10, 60))
    assert [p for _, p in guard.risk_readings] == [0.9] * 5 + [0.1] * 6


class QuietRisk(FlickeringRisk):
    """The same model after a resume: ok at every reading."""

    def predict_window(self, frame, context=None) -> float:
        return 0.1


def test_a_held_warning_holds_on_across_a_resume(tmp_path, risk_model):
    model, opt = tiny_model()
    first = Guard(model, opt, tmp_path, risk=FlickeringRisk(risk_model.schema))
    loop = Loop()
    for _ in range(30):  # the warn of step 9 is held from step 10
        first.step(loop.loss(model))
        opt.zero_grad()
    state = first.state_dict()
    first.close()
    second = Guard(model, opt, tmp_path / "resumed", risk=QuietRisk(risk_model.schema))
    second.load_state_dict(state)
    levels = []
    for _ in range(40):  # steps 30-69: readings at 39, 49, 59 are ok
        second.step(loop.loss(model))
        opt.zero_grad()
        levels.append(second.level)
    second.close()
    warned = [30 + i for i, level in enumerate(levels) if level == "warn"]
    assert warned == list(range(30, 60))  # held until the reading of step 59
