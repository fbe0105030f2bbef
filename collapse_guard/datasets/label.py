"""Moved to :mod:`collapse_guard.runfiles.label`; this path is kept for one release."""

from collapse_guard.runfiles.label import *  # noqa: F403
from collapse_guard.runfiles.label import __all__ as _moved

__all__ = list(_moved)
