"""Durable renames, shared by the run-file writer and the guard's checkpoints.

Kept at the top level, with nothing but the standard library, so that ``datasets`` and
``guard`` both use it without importing each other (docs/design.md, "Layout").
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir"]


def fsync_dir(folder: Path) -> None:
    """Make a rename durable: on POSIX the directory entry lives in the folder."""
    if os.name != "posix":  # Windows cannot open a folder; its rename is journalled
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
