"""Fixtures of the guard's tests: the bundled risk model once, and a risk of a chosen level;
the guard's preflight warnings (the tiny test set-ups are outside the seed's ranges) off in
every test here (a test of them records its own)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # guard_helpers

_HERE = Path(__file__).parent
_NO_PREFLIGHT = pytest.mark.filterwarnings("ignore:collapse-guard preflight")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(_NO_PREFLIGHT)


class FixedRisk:
    """A RiskModel stand-in answering one level (the real schema, so the context works)."""

    hold_steps = 0  # each answer as it comes: a test sets the level it wants

    def __init__(self, schema, level: str = "ok", probability: float = 0.5) -> None:
        self.schema, self.fixed, self.p = schema, level, probability
        self.calls = 0

    def predict_window(self, frame, context=None) -> float:
        self.calls += 1
        return self.p

    def level(self, p: float) -> str:
        return self.fixed


@pytest.fixture(scope="session")
def risk_model():
    from collapse_guard.predictor import RiskModel

    return RiskModel.load()


@pytest.fixture
def fixed_risk(risk_model):
    def make(level: str = "ok", probability: float = 0.5) -> FixedRisk:
        return FixedRisk(risk_model.schema, level, probability)

    return make
