"""The ``mlflow.pyfunc`` face of a risk model, logged as a model from code.

``predictor.lifecycle.registry`` logs this *file* (``python_model=<path of this file>``); MLflow
copies it into the model and runs it at load time, where :func:`mlflow.models.set_model`
names the model object. Nothing is pickled: the model itself is the ``risk_model``
artifact folder (``RiskModel.save``: a text booster and a JSON spec). Loading needs
collapse-guard installed (it is in the model's pip requirements).

Not imported by the library: importing it would register a model object in mlflow.
"""

from __future__ import annotations

import mlflow
import pandas as pd

from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.core.store import FOLDER_ARTIFACT

__all__ = ["RiskPyfunc"]


class RiskPyfunc(mlflow.pyfunc.PythonModel):
    """One run frame in, risk and level by step out."""

    def load_context(self, context) -> None:
        self.model = RiskModel.load_folder(context.artifacts[FOLDER_ARTIFACT])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        risk = self.model.predict_run(model_input)
        return pd.DataFrame(
            {
                "step": risk.index.to_numpy(dtype="int64"),
                "p_collapse": risk.to_numpy(dtype="float64"),
                "level": [self.model.level(p) for p in risk.to_numpy()],
            }
        )


mlflow.models.set_model(RiskPyfunc())
