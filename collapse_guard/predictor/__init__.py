"""The collapse predictor: training, calibration, levels, evaluation, baselines.

>>> from collapse_guard.predictor import RiskModel
>>> model = RiskModel.load()                 # bundled default model
>>> risk = model.predict_run(frame)          # P(collapse within the horizon) by step
>>> model.thresholds                         # {"watch": p, "warn": p, "critical": p}
>>> model.level(risk.iloc[-1]) >= WARN       # a Level: ordered, and its own name ("warn")
>>> result = train_risk_model(paths)         # a TrainingResult: model, report, split
>>> result = train_risk_model(paths, TrainConfig(seed=3, hold_steps=25))  # every setting
>>> log_result(result)                       # MLflow run, registered, promoted if better

Layers, each a package whose imports point one way (tests/test_layers.py pins them):
``core`` (the model as users, the service and the guard load it: RiskModel, calibration,
levels, the hold) <- ``evaluate`` (scorers, events, reports, baselines; never fits) <-
``training`` (rows, splits, fitting, cross-fitting, leave-one-group-out) <- ``lifecycle``
(MLflow registry, promotion, the frozen benchmark, retrain, the bundled model) <- ``cli``
(the commands: the only layer that prints). guard/ and service/ import only ``core``.

Names are imported on first use (PEP 562), so ``import collapse_guard.predictor``
costs nothing and never imports torch; LightGBM and scikit-learn load with the first
name that needs them, mlflow only with ``log_result``.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "CRITICAL",
    "DEFAULT_BUDGETS",
    "LEVELS",
    "OK",
    "WARN",
    "WATCH",
    "Calibrator",
    "CollapsePredictor",
    "EvalReport",
    "FeatureMismatchError",
    "Level",
    "ModelFormatError",
    "RiskModel",
    "RunSplit",
    "TrainConfig",
    "TrainingResult",
    "build_training_data",
    "default_baselines",
    "evaluate_runs",
    "load_runs",
    "log_result",
    "split_runs",
    "thresholds_from_budgets",
    "train_risk_model",
]

# public name -> module that defines it (a layer's, or runfiles.records for run loading)
_WHERE = {
    "DEFAULT_BUDGETS": "predictor.core.levels",
    "LEVELS": "predictor.core.levels",
    "Level": "predictor.core.levels",
    "OK": "predictor.core.levels",
    "WATCH": "predictor.core.levels",
    "WARN": "predictor.core.levels",
    "CRITICAL": "predictor.core.levels",
    "thresholds_from_budgets": "predictor.core.levels",
    "Calibrator": "predictor.core.calibration",
    "CollapsePredictor": "predictor.core.model",
    "FeatureMismatchError": "predictor.core.model",
    "ModelFormatError": "predictor.core.risk",
    "RiskModel": "predictor.core.risk",
    "EvalReport": "predictor.evaluate.report",
    "evaluate_runs": "predictor.evaluate.report",
    "default_baselines": "predictor.evaluate.baselines",
    "RunSplit": "predictor.training.data",
    "build_training_data": "predictor.training.data",
    "split_runs": "predictor.training.data",
    "TrainConfig": "predictor.training.config",
    "TrainingResult": "predictor.training.train",
    "train_risk_model": "predictor.training.train",
    "log_result": "predictor.lifecycle.registry",
    "load_runs": "runfiles.records",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"collapse_guard.{_WHERE[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
