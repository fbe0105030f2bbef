"""Recording the probe's records straight into a run file.

``collapse_guard.datasets`` is imported here lazily, inside :func:`open_writer`: the
probe package must import without it (DESIGN.md: dependencies point one way, and the
run-file module pulls in pandas and pyarrow).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

__all__ = ["open_writer"]


def open_writer(path: str | os.PathLike, meta: Any = None, chunk_steps: int = 256) -> Any:
    """A ``RunWriter`` on ``path``; default meta: a fresh uuid run id, source "real"."""
    from collapse_guard.datasets.runfile import RunMeta, RunWriter

    if meta is None:
        meta = RunMeta(run_id=uuid.uuid4().hex, source="real", config={})
    elif not isinstance(meta, RunMeta):
        raise TypeError(
            f"meta must be a collapse_guard.datasets.runfile.RunMeta, got "
            f"{type(meta).__name__}; build one with RunMeta(run_id=..., source=...)"
        )
    return RunWriter(path, meta, chunk_steps=chunk_steps)
