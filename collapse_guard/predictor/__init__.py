"""The collapse predictor: training, calibration, levels, evaluation, baselines.

>>> from collapse_guard.predictor import RiskModel
>>> model = RiskModel.load()                 # bundled default model
>>> risk = model.predict_run(frame)          # P(collapse within the horizon) by step
>>> model.thresholds                         # {"watch": p, "warn": p, "critical": p}
>>> result = train_risk_model(paths)         # a TrainingResult: model, report, split
>>> log_result(result)                       # MLflow run, registered, promoted if better

Names are imported on first use (PEP 562), so ``import collapse_guard.predictor``
costs nothing and never imports torch; LightGBM and scikit-learn load with the first
name that needs them, mlflow only with ``log_result``.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "DEFAULT_BUDGETS",
    "LEVELS",
    "Calibrator",
    "CollapsePredictor",
    "EvalReport",
    "FeatureMismatchError",
    "ModelFormatError",
    "RiskModel",
    "RunSplit",
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

# public name -> submodule that defines it
_WHERE = {
    "DEFAULT_BUDGETS": "levels",
    "LEVELS": "levels",
    "thresholds_from_budgets": "levels",
    "Calibrator": "calibration",
    "CollapsePredictor": "model",
    "FeatureMismatchError": "model",
    "EvalReport": "evaluation",
    "evaluate_runs": "evaluation",
    "ModelFormatError": "risk",
    "RiskModel": "risk",
    "RunSplit": "training_data",
    "build_training_data": "training_data",
    "load_runs": "training_data",
    "split_runs": "training_data",
    "default_baselines": "baselines",
    "TrainingResult": "train",
    "train_risk_model": "train",
    "log_result": "registry",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
