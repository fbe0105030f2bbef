"""Moved to :mod:`collapse_guard.runfiles.relabel`; this path is kept for one release."""

from collapse_guard.runfiles.relabel import *  # noqa: F403
from collapse_guard.runfiles.relabel import __all__ as _moved

__all__ = list(_moved)
