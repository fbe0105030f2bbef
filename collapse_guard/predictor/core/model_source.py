"""What a user may pass as ``--model``, and loading it with errors a user can act on.

=============================  ===============================================
``--model``                    means
=============================  ===============================================
omitted, ``default``           the model bundled in the package
``champion``, ``@ALIAS``       ``models:/collapse-predictor@ALIAS`` (registry)
``models:/...``, ``runs:/...``  that MLflow model
anything else                  a model folder (``RiskModel.save``)
=============================  ===============================================

A registry model is read from the tracking store, which must exist: a SQLite store that is
not there is an error naming it, never a new empty database (``predictor.core.store.tracking_uri``
with ``create=False``).

Nothing heavy is imported here: lightgbm and mlflow load with the model.
"""

from __future__ import annotations

import sys
from pathlib import Path

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core.store import is_registry_uri, tracking_uri

__all__ = ["MODEL_HELP", "load_risk_model", "require_tracking_store", "resolve_model_source"]

_FORMS = (
    "omitted or 'default' = the bundled model; 'champion' or '@ALIAS' = "
    "models:/collapse-predictor@ALIAS in the MLflow registry; a models:/ or runs:/ URI; "
    "a model folder"
)
MODEL_HELP = f"Model: {_FORMS}."
_DEFAULT = "default"
_CHAMPION = "champion"


def resolve_model_source(text: str | None) -> str | None:
    """``--model`` as ``RiskModel.load`` takes it: None for the bundled model, a registry
    URI for the shorthands, anything else unchanged (a folder named ``champion`` wins).

    A registry model's tracking store must exist (:func:`require_tracking_store`).
    """
    if text is None or text == _DEFAULT:
        return None
    source = text
    if text.startswith("@") or (text == _CHAMPION and not Path(text).exists()):
        from collapse_guard.predictor.core.risk import MODEL_NAME

        alias = text.removeprefix("@")
        if not alias:
            raise UserInputError("--model '@' names no alias", "write e.g. '@champion'")
        source = f"models:/{MODEL_NAME}@{alias}"
    if is_registry_uri(source):
        require_tracking_store(f"--model {text}")
    return source


def require_tracking_store(needed_by: str) -> None:
    """Raise :class:`UserInputError`, naming ``needed_by``, unless the tracking store
    exists (``tracking_uri(create=False)``); never makes one."""
    try:
        tracking_uri(create=False)
    except UserInputError as error:
        raise UserInputError(f"{needed_by}: {error.message}", error.hint) from None


def _load_errors() -> tuple[type[BaseException], ...]:
    """What RiskModel.load raises for a model that is missing, damaged or foreign."""
    import lightgbm

    errors: tuple[type[BaseException], ...] = (
        OSError,  # no such folder or file
        ValueError,  # registry: not found; damaged JSON; ModelFormatError
        KeyError,  # a risk_model.json without a required entry
        lightgbm.basic.LightGBMError,  # a damaged model.txt
    )
    mlflow = sys.modules.get("mlflow.exceptions")  # loaded only for a registry model
    return (*errors, mlflow.MlflowException) if mlflow else errors


def load_risk_model(text: str | None):
    """The model ``--model text`` names; a missing, damaged or foreign one, or a missing
    tracking store, is a :class:`UserInputError` that names it."""
    from collapse_guard.predictor.core.risk import RiskModel

    source = resolve_model_source(text)
    try:
        return RiskModel.load(source)
    except _load_errors() as error:
        raise UserInputError(f"--model {text}: {error}", f"--model takes: {_FORMS}") from error
