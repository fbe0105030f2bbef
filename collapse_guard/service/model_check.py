"""Moved to :mod:`collapse_guard.service.server.model_check`; this path is kept for one release."""

from collapse_guard.service.server.model_check import (
    BOOSTER_FILE,
    ModelFileError,
    check_booster_file,
    staged_model,
)

__all__ = [
    "BOOSTER_FILE",
    "ModelFileError",
    "check_booster_file",
    "staged_model",
]
