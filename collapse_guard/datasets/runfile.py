"""Moved to :mod:`collapse_guard.runfiles` (its ``format``, ``writer`` and ``reader``
modules); this path is kept for one release."""

from collapse_guard.runfiles.format import *  # noqa: F403
from collapse_guard.runfiles.format import __all__ as _format
from collapse_guard.runfiles.reader import *  # noqa: F403
from collapse_guard.runfiles.reader import __all__ as _reader
from collapse_guard.runfiles.writer import *  # noqa: F403
from collapse_guard.runfiles.writer import __all__ as _writer

__all__ = [*_format, *_writer, *_reader]
