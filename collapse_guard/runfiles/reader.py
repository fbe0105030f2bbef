"""Run files read with checks: a damaged, foreign or too new file is refused, by name.

The reader's errors (:class:`~collapse_guard.runfiles.format.UnreadableRunFile`) name the
file, what was expected and what to do; a file of an unknown schema version is refused
rather than misread (:class:`~collapse_guard.runfiles.format.SchemaVersionError`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from collapse_guard.runfiles.format import (
    KNOWN_SCHEMA_VERSIONS,
    META_KEY,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    RunMeta,
    SchemaVersionError,
    UnreadableRunFile,
)
from collapse_guard.signals import SIGNAL_NAMES

__all__ = ["list_runs", "read_meta", "read_run"]


_MAGIC = b"PAR1"  # the first (and last) four bytes of every Parquet file


def _refuse_foreign(path: Path) -> None:
    """A file that does not even begin as Parquet does was never a run file (an image, a CSV
    log): saying it is damaged would send its user to regenerate a run that never was."""
    try:
        with path.open("rb") as file:
            head = file.read(len(_MAGIC))
    except OSError:  # a folder, no permission: pyarrow's own error below says which
        return
    if head != _MAGIC:
        what = "it is empty" if not head else f"it does not begin with Parquet's {_MAGIC!r}"
        raise UnreadableRunFile(
            f"{path} is not a run file (Parquet written by collapse-guard): {what}; a CSV "
            "training log is imported with `collapse-guard data import`"
        )


def _open(path: Path) -> pq.ParquetFile:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such run file")
    _refuse_foreign(path)
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise UnreadableRunFile(
            f"{path}: not a readable Parquet run file ({exc}); it may be truncated or "
            "damaged: delete it and regenerate the run (a RunWriter never leaves a "
            "partial file behind, so this one was cut by something else)"
        ) from None


def _meta_from_schema(path: Path, schema: pa.Schema) -> RunMeta:
    raw = (schema.metadata or {}).get(META_KEY.encode())
    if raw is None:
        raise UnreadableRunFile(
            f"{path}: Parquet file without {META_KEY!r} metadata: not a collapse-guard run "
            "file; convert training logs with `collapse-guard data import`"
        )
    meta = RunMeta.from_json(raw, path=path)
    if meta.schema_version not in KNOWN_SCHEMA_VERSIONS:
        raise SchemaVersionError(
            f"{path}: run-file schema version {meta.schema_version} is not known to this "
            f"reader (it reads version(s) {', '.join(map(str, KNOWN_SCHEMA_VERSIONS))}, "
            f"current {SCHEMA_VERSION}); upgrade collapse-guard to read this file"
        )
    return meta


def read_meta(path: str | os.PathLike) -> RunMeta:
    """The run's metadata, from the footer only (cheap: no column is read)."""
    path = Path(path)
    return _meta_from_schema(path, _open(path).schema_arrow)


def read_run(path: str | os.PathLike) -> tuple[pd.DataFrame, RunMeta]:
    """Read a run file: ``(frame, meta)``.

    The frame's columns are exactly ``RUN_COLUMNS`` (``step`` int64, signals float64,
    ``event`` str). Signal columns absent from the file (older or partial writers)
    come back as NaN; columns unknown to this version are dropped. Measured NaN/inf
    values are returned as they were written.
    """
    path = Path(path)
    pfile = _open(path)
    meta = _meta_from_schema(path, pfile.schema_arrow)
    present = [c for c in RUN_COLUMNS if c in pfile.schema_arrow.names]
    if "step" not in present:
        raise UnreadableRunFile(f"{path}: run file has no 'step' column; the file is damaged")
    try:
        table = pfile.read(columns=present)
    except (pa.ArrowException, OSError) as exc:
        raise UnreadableRunFile(
            f"{path}: cannot read the run's columns ({exc}); the file is damaged: "
            "delete it and regenerate the run"
        ) from None
    return _to_frame(table, len(table)), meta


def _to_frame(table: pa.Table, n: int) -> pd.DataFrame:
    columns: dict[str, Any] = {}
    names = set(table.column_names)
    columns["step"] = table.column("step").to_numpy().astype(np.int64)
    for name in SIGNAL_NAMES:
        if name in names:
            columns[name] = (
                table.column(name).cast(pa.float64()).to_numpy(zero_copy_only=False)
            ).astype(np.float64)
        else:
            columns[name] = np.full(n, np.nan)
    if "event" in names:
        events = table.column("event").to_pylist()
        columns["event"] = ["" if e is None else e for e in events]
    else:
        columns["event"] = [""] * n
    frame = pd.DataFrame(columns)
    frame["event"] = frame["event"].astype(str)
    return frame


def list_runs(folder: str | os.PathLike) -> list[Path]:
    """Every ``*.parquet`` under ``folder`` (recursively), sorted; temp files excluded."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder of run files")
    return sorted(p for p in folder.rglob("*.parquet") if p.is_file())
