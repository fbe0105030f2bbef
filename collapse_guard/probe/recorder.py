"""Where the probe's records go: any sink object, or a run file by its path.

A sink is anything with ``append(step, record, event="")`` and ``close()``:
``collapse_guard.runfiles.writer.RunWriter`` is one, a list-backed test double or a
logger adapter can be another. ``probe.record_to(sink)`` appends every record to it;
``probe.record_to(path)`` opens a ``RunWriter`` there.

``collapse_guard.runfiles``, the floor below the probe, is imported here lazily, inside
:func:`open_writer`, and only for a path: the probe package must import without it (the
run-file modules pull in pandas and pyarrow).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Protocol, runtime_checkable

__all__ = ["RecordSink", "open_writer"]


@runtime_checkable
class RecordSink(Protocol):
    """What the probe (and the guard) write records to."""

    def append(self, step: int, record: dict[str, float], event: str = "") -> None: ...

    def close(self) -> Any: ...


def open_writer(
    path: str | os.PathLike | RecordSink, meta: Any = None, chunk_steps: int = 256
) -> Any:
    """``path`` itself when it is a sink; else a ``RunWriter`` on it (default meta: a fresh
    uuid run id, source "real")."""
    if isinstance(path, RecordSink):
        return path
    from collapse_guard.runfiles.format import RunMeta
    from collapse_guard.runfiles.writer import RunWriter

    if meta is None:
        meta = RunMeta(run_id=uuid.uuid4().hex, source="real", config={})
    elif not isinstance(meta, RunMeta):
        raise TypeError(
            f"meta must be a collapse_guard.runfiles.RunMeta, got "
            f"{type(meta).__name__}; build one with RunMeta(run_id=..., source=...)"
        )
    return RunWriter(path, meta, chunk_steps=chunk_steps)
