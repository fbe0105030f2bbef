"""One frozen object for every setting of a training: ``TrainConfig``.

``train_risk_model``, ``fit_risk_model``, ``fit_and_level``, ``leave_one_group_out``,
``retrain`` and the bundle take a ``config`` (and, for a call written by hand, its fields
as keywords over it: ``train_risk_model(paths, seed=3)``) and hand the one object on, so
a new knob is one field here, not a keyword threaded through eight files. The model's
meta (``train_config``), the MLflow params and retrain's idempotency key all record
``to_dict()``, so what trained a model is read back from one place.

>>> config = TrainConfig(seed=3, stride=20, hold_steps=25)
>>> config.replace(seed=4).to_dict()["seed"]
4
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from collapse_guard.errors import UserInputError
from collapse_guard.features import DEFAULT_WINDOW
from collapse_guard.predictor.core.calibration import CALIBRATION_METHODS
from collapse_guard.predictor.core.hold import DEFAULT_HOLD_STEPS
from collapse_guard.predictor.core.levels import DEFAULT_BUDGETS
from collapse_guard.predictor.core.model import DEFAULT_STRIDE
from collapse_guard.predictor.training.data import (
    DEFAULT_FRACTIONS,
    HEALTHY_RISE_WEIGHT,
    MODEL_SIGNALS,
    POSITIVES_WITHIN,
)
from collapse_guard.runfiles.label import HORIZON

__all__ = ["TrainConfig"]


@dataclass(frozen=True)
class TrainConfig:
    """What one training is asked to do; every field has the default the project measured."""

    seed: int = 0  # seeds the run split, LightGBM and the learned baselines
    window: int = DEFAULT_WINDOW  # feature window, steps
    horizon: int = HORIZON  # steps ahead predicted (H)
    stride: int = DEFAULT_STRIDE  # training rows every stride-th step (core.model says why)
    hold_steps: int = DEFAULT_HOLD_STEPS  # the levels are set on the risk held this long
    # the rows a collapse trains as positives: those within this many steps of its onset,
    # the rows further ahead inside the horizon left out (data.near_positives); None: all
    positives_within: int | None = POSITIVES_WITHIN
    # what a healthy row inside an LR rise weighs in the fit (data.healthy_rise_weights)
    healthy_rise_weight: float = HEALTHY_RISE_WEIGHT
    # healthy steps between false alarms, per level (core.levels)
    budgets: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_BUDGETS))
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS  # train / validation / test shares
    calibration: str = "platt"  # or "isotonic" (core.calibration)
    eval_budget_per_10k: float = 1.0  # the evaluation's ROC-like "recall at budget" rate
    params: Mapping[str, Any] = field(default_factory=dict)  # CollapsePredictor overrides
    signals: tuple[str, ...] = MODEL_SIGNALS  # what the model predicts from
    # opt-in run-context fields (features.context_fields.OPT_IN_CONTEXT), none by default:
    # the ablation inside LR rises did not keep them (benchmarks/README.md)
    extra_context: tuple[str, ...] = ()
    # the levels from each group's runs scored by a model fitted without it (crossfit);
    # None: from the validation runs alone
    levels_by: str | None = "family"

    def __post_init__(self) -> None:
        # copies, so that a caller's dict changed later changes no config
        object.__setattr__(self, "budgets", dict(self.budgets))
        object.__setattr__(self, "params", dict(self.params or {}))
        object.__setattr__(self, "fractions", tuple(float(f) for f in self.fractions))
        object.__setattr__(self, "signals", tuple(self.signals))
        object.__setattr__(self, "extra_context", tuple(self.extra_context))
        for name in ("window", "horizon", "stride"):
            if int(getattr(self, name)) < 1:
                raise UserInputError(
                    f"{name} must be at least 1 step; got {getattr(self, name)}",
                    f"e.g. {name}={getattr(TrainConfig, name)}",
                )
        if self.positives_within is not None and not 1 <= self.positives_within <= self.horizon:
            raise UserInputError(
                f"positives_within must be 1 to the horizon ({self.horizon}) steps, or None; "
                f"got {self.positives_within}",
                "e.g. positives_within=100",
            )
        if not (math.isfinite(self.healthy_rise_weight) and self.healthy_rise_weight > 0):
            raise UserInputError(
                "healthy_rise_weight must be a positive finite number; "
                f"got {self.healthy_rise_weight}",
                "e.g. healthy_rise_weight=3 (1: every row weighs the same)",
            )
        if self.hold_steps < 0:
            raise UserInputError(
                f"hold_steps must be 0 or more steps; got {self.hold_steps}", "e.g. 50"
            )
        if self.calibration not in CALIBRATION_METHODS:
            raise UserInputError(
                f"calibration must be one of {', '.join(CALIBRATION_METHODS)}; "
                f"got {self.calibration!r}",
                "e.g. calibration='platt'",
            )

    @classmethod
    def of(cls, config: TrainConfig | None = None, **settings: Any) -> TrainConfig:
        """``config`` (default: the defaults) with ``settings`` over it; an unknown name is
        an error that lists the known ones."""
        return (config or cls()).replace(**settings)

    def replace(self, **settings: Any) -> TrainConfig:
        """A copy with ``settings`` changed (``dataclasses.replace``, names checked)."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise TypeError(
                f"unknown training setting(s) {unknown}; TrainConfig has {sorted(known)}"
            )
        return dataclasses.replace(self, **settings) if settings else self

    @classmethod
    def from_dict(cls, recorded: Mapping[str, Any]) -> TrainConfig:
        """The config a ``to_dict()`` recorded (a model's ``meta["train_config"]``). Settings
        this code no longer knows are dropped (a model of another version); the ones added
        since take their defaults."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in recorded.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields (the model's ``meta["train_config"]``, MLflow params)."""
        out = dataclasses.asdict(self)
        out["fractions"] = list(self.fractions)
        out["signals"] = list(self.signals)
        out["extra_context"] = list(self.extra_context)
        return out
