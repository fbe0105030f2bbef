"""What the evaluation scores: the model and every baseline behind one small protocol."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from collapse_guard.predictor.core.levels import Level

__all__ = ["LEVEL_POINT", "ModelScorer", "Scorer", "level_point"]

LEVEL_POINT = "level:"  # what names a model's stored level as an operating point


def level_point(level: Level | str) -> str:
    """The operating point of a model's stored ``level``: ``level:warn`` for WARN."""
    return f"{LEVEL_POINT}{level}"


@runtime_checkable
class Scorer(Protocol):
    """A per-step alarm score and the operating points set without the test runs.

    - ``score_run(frame)``: one score per row of a run frame (``step`` + signal columns),
      higher = more alarming, NaN = no opinion yet;
    - ``operating_points()``: name -> threshold on that score, each set *before* the
      test runs were seen (the model's stored levels, a baseline's threshold tuned on
      validation runs); a step alarms when its score is >= the threshold;
    - ``alarm_run(frame)``: the original's own rule where it is not one threshold on the
      score (OLMo-core's either-signal test, KillLossSpike's patience), else None;
    - ``probabilistic``: scores are P(collapse within H), so a Brier score means something.
    """

    name: str
    probabilistic: bool

    def score_run(self, frame: pd.DataFrame) -> np.ndarray: ...

    def operating_points(self) -> Mapping[str, float]: ...

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray | None: ...


class ModelScorer:
    """A ``RiskModel`` as a :class:`Scorer`: calibrated risk at every recorded row, and its
    stored levels (``level:watch``, ``level:warn``, ``level:critical``, set on validation runs).

    ``scores``: per-run risk already computed by the caller (one array per run, in the
    order the runs will be scored), to skip re-scoring.
    """

    probabilistic = True

    def __init__(
        self, model=None, *, scores: Sequence[np.ndarray] | None = None, name: str = "model"
    ) -> None:
        if model is None and scores is None:
            raise ValueError("ModelScorer needs a RiskModel or precomputed scores; got neither")
        self.model = model
        self.name = name
        self._scores: Iterator[np.ndarray] | None = iter(scores) if scores is not None else None

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        if self._scores is not None:
            return np.asarray(next(self._scores), dtype=np.float64)
        # scored at the recorded rows, like the baselines (not across row gaps)
        return self.model.predict_run(frame, steps=frame["step"].to_numpy()).to_numpy()

    def operating_points(self) -> dict[str, float]:
        if self.model is None:
            return {}
        return {level_point(k): float(v) for k, v in self.model.thresholds.items()}

    def alarm_run(self, frame: pd.DataFrame) -> None:
        return None
