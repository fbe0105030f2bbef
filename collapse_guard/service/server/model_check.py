"""A model's files, read where a native crash cannot take a worker down: moved down to
:mod:`collapse_guard.predictor.core.model_file`, the one loader under ``RiskModel.load``
(so under the service's start, ``/reload``, ``serve --model`` and ``Guard(risk=FOLDER)``).
The names the server and its tests use are kept here.
"""

from __future__ import annotations

from collapse_guard.predictor.core.model_file import (
    BOOSTER_FILE,
    ModelFileError,
    check_booster_file,
    staged_model,
)

__all__ = ["BOOSTER_FILE", "ModelFileError", "check_booster_file", "staged_model"]
