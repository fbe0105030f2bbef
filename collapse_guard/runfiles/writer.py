"""Run files written durably: row by row (:class:`RunWriter`) or whole (:func:`write_run`).

Durability. A Parquet file keeps its index (the footer) at its end, so a file cannot
be appended to in place and stay readable at every instant. :class:`RunWriter`
therefore rewrites the whole run so far into a temporary file in the same folder,
fsyncs it, renames it over the run file (atomic on POSIX) and fsyncs the folder.
At every moment the path holds either the previous complete file or the new
complete file: a crash (even SIGKILL or power loss) loses at most the chunk being
written, never a finished one. The cost grows with the square of the number of
chunks but is small at the sizes runs have here: a 20,000-step run with all signal
columns and ``chunk_steps=256`` (79 rewrites) spends about 2.7 s in all on them
(135 us a step; 3.2 s to write the run against 0.55 s for one write at the end),
measured on the shared 2-core machine. A 100,000-step run would pay ~25x that:
raise ``chunk_steps`` there. The guard also flushes at every checkpoint (its durable point:
a resume starts there, so the rows up to it must be on disk), by default every 100
healthy steps: a 20,000-step guarded run rewrites 200 times, 14.5 s in all on the loaded
machine (0.7 ms a step; the last rewrite, of 20,000 rows, 115 ms).

A full disk. With ``keep_on_error=True`` (the guard's writer: a training loop never stops
for the disk) a write the disk refuses (``OSError``: ENOSPC, EDQUOT, EIO, a folder gone)
raises nothing: the writer holds every row it accepted in memory anyway (each rewrite is
of the whole run), so none is lost; it says once, in a warning naming the file and the
steps not on disk, and writes them all at the next flush the disk takes. Only a
``close()`` the disk still refuses loses rows: a second warning names them (the file on
disk keeps the rows up to its last good write; ``rows_lost`` counts the others), and a
later ``close()`` tries again.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from collapse_guard._config import reject_unknown_keys
from collapse_guard._durable import fsync_dir
from collapse_guard.runfiles.format import (
    EXACT_SIGNALS,
    META_KEY,
    RUN_COLUMNS,
    RunFileError,
    RunMeta,
    UnreadableRunFile,
)
from collapse_guard.signals import SIGNAL_NAMES

__all__ = ["RunWriter", "compact_file", "is_compact", "write_run"]

_SIGNAL_SET = frozenset(SIGNAL_NAMES)
# format.py's layout as Arrow types: what every file is written with
_ARROW_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int64(), nullable=False),
        *(pa.field(name, pa.float64()) for name in SIGNAL_NAMES),
        pa.field("event", pa.string()),
    ]
)
# Rewrites are small; zstd keeps files compact (NaN-heavy attention columns compress
# to almost nothing) at a speed close to snappy.
_COMPRESSION = "zstd"
# A compact file is written once and read by every training: float32, zstd's level 9 and
# floats split by byte (sign and exponent bytes compress apart from the noisy mantissa)
# made 10 runs of the seed-0 corpus 42.6 KB each against 64.0 KB as float64 files
# (benchmarks/corpus_speed.py); the byte split does most of it, level 9 saves 4 % more
_COMPACT_LEVEL = 9


def _durable_write(path: Path, table: pa.Table, **options: Any) -> None:
    """Write ``table`` to ``path`` so that ``path`` is always a complete file.

    tmp file in the same folder (same filesystem, so the rename is atomic) -> fsync
    -> os.replace -> fsync the folder. ``options`` go to ``pq.write_table``.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as sink:
            pq.write_table(table, sink, compression=_COMPRESSION, **options)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _with_meta(table: pa.Table, meta: RunMeta) -> pa.Table:
    return table.replace_schema_metadata({META_KEY: meta.to_json()})


class RunWriter:
    """Append steps to a run file; every ``chunk_steps`` rows are made durable.

    ``append`` buffers a row; when ``chunk_steps`` rows are pending the whole run is
    rewritten atomically (see the module docstring), so a crash loses at most the
    unfinished chunk. ``flush()`` makes pending rows durable now; ``close()`` flushes
    and sets final metadata (onset, label version, extra). An existing file at
    ``path`` is replaced at the first flush. Use as a context manager.

    ``rows_written`` counts rows that are durable on disk; ``rows_appended`` counts
    every row handed to ``append``. ``keep_on_error``: a write the disk refuses keeps the
    rows in memory and warns once instead of raising (module docstring, "A full disk").
    """

    def __init__(
        self,
        path: str | os.PathLike,
        meta: RunMeta,
        *,
        chunk_steps: int = 256,
        keep_on_error: bool = False,
    ) -> None:
        if isinstance(chunk_steps, bool) or not isinstance(chunk_steps, int) or chunk_steps < 1:
            raise ValueError(f"chunk_steps must be an int >= 1, got {chunk_steps!r}")
        if not isinstance(meta, RunMeta):
            raise TypeError(f"meta must be a RunMeta, got {type(meta).__name__}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.meta = meta
        self.chunk_steps = chunk_steps
        self.rows_written = 0
        self.rows_appended = 0
        self._batches: list[pa.RecordBatch] = []
        self._pending: dict[str, list] = {name: [] for name in RUN_COLUMNS}
        self._last_step: int | None = None
        self._closed = False
        self._on_disk = False  # the file at path reflects this writer's rows and meta
        self.keep_on_error = bool(keep_on_error)
        self.write_error = ""  # the last write the disk refused ("" once one succeeds)
        self.rows_lost = 0  # rows a close() could not write (keep_on_error)
        self._warned = False

    # -- context manager
    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Also on an exception: the rows collected so far are the run's evidence.
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def durable(self) -> bool:
        """Every appended row and the metadata are on disk."""
        return self._on_disk

    def append(self, step: int, record: Mapping[str, float], event: str = "") -> None:
        """Buffer one step. Signals missing from ``record`` are NaN (not measured)."""
        if self._closed:
            raise RunFileError(
                f"{self.path}: append after close(); open a new RunWriter to write another run"
            )
        step = self._check_step(step, record)
        row = self._pending
        unknown = [k for k in record if k not in _SIGNAL_SET and k != "step"]
        if unknown:
            raise RunFileError(
                f"{self.path}: unknown signal name(s) {sorted(unknown)} at step {step}; "
                f"known names are: {', '.join(SIGNAL_NAMES)} "
                "(add new signals to collapse_guard.signals.SIGNALS)"
            )
        # Convert everything before touching the buffer: a bad value must not leave
        # a half-appended row behind.
        values = [_to_float(record.get(name), name, step, self.path) for name in SIGNAL_NAMES]
        for name, value in zip(SIGNAL_NAMES, values, strict=True):
            row[name].append(value)
        row["step"].append(step)
        row["event"].append("" if event is None else str(event))
        self._last_step = step
        self.rows_appended += 1
        self._on_disk = False
        if len(row["step"]) >= self.chunk_steps:
            self.flush()

    def _check_step(self, step: int, record: Mapping[str, float]) -> int:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise RunFileError(f"{self.path}: step must be an int, got {step!r}")
        step = int(step)
        if "step" in record and record["step"] != step:
            raise RunFileError(
                f"{self.path}: record['step']={record['step']!r} disagrees with step={step}"
            )
        if self._last_step is not None and step <= self._last_step:
            raise RunFileError(
                f"{self.path}: steps must strictly increase; got {step} after "
                f"{self._last_step}. After a rollback keep counting forward and mark it "
                "with an event instead of reusing step numbers"
            )
        return step

    def flush(self) -> None:
        """Make every appended row (and the current metadata) durable now."""
        if self._pending["step"]:
            arrays = [
                pa.array(self._pending[f.name], type=f.type, from_pandas=False)
                for f in _ARROW_SCHEMA
            ]
            self._batches.append(pa.RecordBatch.from_arrays(arrays, schema=_ARROW_SCHEMA))
            self._pending = {name: [] for name in RUN_COLUMNS}
        elif self._on_disk:
            return
        table = pa.Table.from_batches(self._batches, schema=_ARROW_SCHEMA)
        try:
            _durable_write(self.path, _with_meta(table, self.meta))
        except OSError as error:
            if not self.keep_on_error:
                raise
            self._refused(error, table)
            return
        self.rows_written = table.num_rows
        self.write_error, self.rows_lost = "", 0
        self._on_disk = True

    def _refused(self, error: OSError, table: pa.Table) -> None:
        """A write the disk refused (``keep_on_error``): the rows stay; said once."""
        self.write_error = f"{type(error).__name__} [Errno {error.errno}] {error.strerror}"
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"collapse-guard: could not write the run file {self.path} ({self.write_error})"
            f"; {self._unwritten(table)} are kept in memory and written at the next flush "
            "the disk takes (training goes on; nothing more is said unless close() cannot "
            f"write them either); free space in {self.path.parent}",
            RuntimeWarning,
            stacklevel=4,
        )

    def _unwritten(self, table: pa.Table) -> str:
        steps, n = table.column("step"), table.num_rows - self.rows_written
        if n <= 0:
            return "its metadata (every row is on disk)"
        return f"its {n} row(s) not on disk (steps {steps[self.rows_written]}-{steps[-1]})"

    def close(self, **meta_updates: Any) -> Path:
        """Flush, apply ``meta_updates`` (e.g. ``onset_step=``), and return the path.

        ``extra=`` is merged into the existing extra dict. Idempotent: a second call
        returns the path; with new ``meta_updates`` it rewrites the metadata (and, with
        ``keep_on_error``, tries again to write what a full disk refused).
        """
        if meta_updates:
            self.update_meta(**meta_updates)
        if not (self._closed and self._on_disk):
            self.flush()
        self._closed = True
        if not self._on_disk and self.keep_on_error:
            self.rows_lost = self.rows_appended - self.rows_written
            table = pa.Table.from_batches(self._batches, schema=_ARROW_SCHEMA)
            lost = self._unwritten(table)
            warnings.warn(
                f"collapse-guard: the run file {self.path} could not be written at close "
                f"({self.write_error}): {lost} are lost (the file on disk holds the first "
                f"{self.rows_written} row(s)); free space and call close() again to keep them",
                RuntimeWarning,
                stacklevel=2,
            )
        return self.path

    def update_meta(self, **updates: Any) -> None:
        """Change the metadata (``extra=`` is merged); on disk with the next flush, which
        rewrites the file even without new rows (lineage is durable before any chunk)."""
        reject_unknown_keys(RunMeta, updates, where=f"{self.path}: metadata", error=RunFileError)
        if "extra" in updates:
            updates = {**updates, "extra": {**self.meta.extra, **(updates["extra"] or {})}}
        self.meta = replace(self.meta, **updates)
        self._on_disk = False


def _to_float(value: Any, name: str, step: int, path: Path) -> float:
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RunFileError(
            f"{path}: signal {name!r} at step {step} must be a number, got {value!r}; "
            "pass NaN for a value that was not measured"
        ) from None


def _float32_column(name: str, values: np.ndarray) -> bool:
    """May signal ``name`` be stored as float32 (format.py, "compact")?"""
    with np.errstate(over="ignore"):  # an overflow is looked for below
        narrow = values.astype(np.float32)
    if np.array_equal(narrow.astype(np.float64), values, equal_nan=True):
        return True  # nothing is lost
    # a rounded value is fine where the exact one does not matter, a finite value turned
    # into inf never is (a measured non-finite value is data: signals.py)
    overflows = np.isinf(narrow) & np.isfinite(values)
    return name not in EXACT_SIGNALS and not overflows.any()


def _compact_options(table: pa.Table) -> tuple[pa.Table, dict[str, Any]]:
    """``table`` with its float32-worthy signals narrowed, and the compact write options."""
    arrays, fields = [], []
    for field, column in zip(table.schema, table.columns, strict=True):
        if field.name in _SIGNAL_SET:
            values = column.to_numpy()
            if _float32_column(field.name, values):
                column, field = pa.array(values.astype(np.float32)), field.with_type(pa.float32())
        arrays.append(column)
        fields.append(field)
    floats = [f.name for f in fields if pa.types.is_floating(f.type)]
    options = {
        "compression_level": _COMPACT_LEVEL,
        "use_dictionary": ["event"],  # floats seldom repeat: dictionary pages only cost
        "use_byte_stream_split": floats,
    }
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields)), options


def write_run(
    path: str | os.PathLike, frame: pd.DataFrame, meta: RunMeta, *, compact: bool = False
) -> Path:
    """Write a whole run at once (durably, replacing any file at ``path``).

    ``frame`` needs a ``step`` column; missing signal columns become NaN and a missing
    ``event`` column becomes empty strings. Unknown columns are an error. ``compact``
    stores the signals float32 where that loses nothing that matters (format.py).
    """
    path = Path(path)
    if not isinstance(meta, RunMeta):
        raise TypeError(f"meta must be a RunMeta, got {type(meta).__name__}")
    unknown = [c for c in frame.columns if c not in RUN_COLUMNS]
    if unknown:
        raise RunFileError(
            f"{path}: frame has unknown column(s) {unknown}; run files hold "
            f"{', '.join(RUN_COLUMNS)} (rename or drop the others)"
        )
    if "step" not in frame.columns:
        raise RunFileError(f"{path}: frame has no 'step' column; add one (int training step)")
    steps = frame["step"].to_numpy()
    if not np.issubdtype(steps.dtype, np.integer):
        if not np.all(np.isfinite(steps.astype(float))) or np.any(steps != np.round(steps)):
            raise RunFileError(f"{path}: 'step' must hold whole numbers, got dtype {steps.dtype}")
    steps = steps.astype(np.int64)
    if steps.size > 1 and np.any(np.diff(steps) <= 0):
        bad = int(np.argmax(np.diff(steps) <= 0)) + 1
        raise RunFileError(
            f"{path}: steps must strictly increase; row {bad} has step {steps[bad]} after "
            f"{steps[bad - 1]} (sort by step and drop duplicates first)"
        )
    arrays = [pa.array(steps, type=pa.int64())]
    for name in SIGNAL_NAMES:
        if name in frame.columns:
            values = pd.to_numeric(frame[name], errors="raise").to_numpy(dtype=np.float64)
        else:
            values = np.full(len(frame), np.nan)
        arrays.append(pa.array(values, type=pa.float64(), from_pandas=False))
    if "event" in frame.columns:
        events = ["" if not isinstance(e, str) else e for e in frame["event"].tolist()]
    else:
        events = [""] * len(frame)
    arrays.append(pa.array(events, type=pa.string()))
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_arrays(arrays, schema=_ARROW_SCHEMA)
    options: dict[str, Any] = {}
    if compact:
        table, options = _compact_options(table)
    _durable_write(path, _with_meta(table, meta), **options)
    return path


def is_compact(path: str | os.PathLike) -> bool:
    """Whether the run file at ``path`` was written compact (a float32 signal column)."""
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise UnreadableRunFile(
            f"{path}: not a readable Parquet run file ({exc}); delete it and regenerate the run"
        ) from None
    return any(
        schema.field(name).type == pa.float32() for name in schema.names if name in _SIGNAL_SET
    )


def compact_file(path: str | os.PathLike) -> bool:
    """Rewrite a float64 run file compact, in place and durably; False when it already was.

    Lossless for runs the probe recorded (format.py, "compact"); a value of another source
    that float32 would round is rounded where its exact value does not matter.
    """
    from collapse_guard.runfiles.reader import read_run

    if is_compact(path):
        return False
    frame, meta = read_run(path)
    write_run(path, frame, meta, compact=True)
    return True
