"""Run files: one training run = one Parquet file, written durably, read with checks.

Layout (DESIGN.md "Run files"):

==================  =========  ====================================================
column              type       what
==================  =========  ====================================================
``step``            int64      training step, strictly increasing (gaps allowed)
every signal name   float64    one column per ``collapse_guard.signals.SIGNAL_NAMES``,
                               in that order; NaN = not measured at this step
``event``           string     empty, or what the guard did at this step
==================  =========  ====================================================

The file's key-value metadata holds JSON under the key ``collapse_guard``: the
fields of :class:`RunMeta` (``run_id``, ``source``, ``config``, ``onset_step``,
``label_version``, ``schema_version``, ``extra``).

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

Example::

    meta = RunMeta(run_id="lr0.05-seed1", source="real", config={"lr": 0.05})
    with RunWriter("runs/lr0.05-seed1.parquet", meta) as writer:
        for step in range(1000):
            writer.append(step, {"loss": 2.5, "grad_norm": 0.8})
    frame, meta = read_run("runs/lr0.05-seed1.parquet")
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from collapse_guard._config import reject_unknown_keys
from collapse_guard._durable import fsync_dir
from collapse_guard.errors import UserInputError
from collapse_guard.signals import SIGNAL_NAMES

__all__ = [
    "KNOWN_SCHEMA_VERSIONS",
    "META_KEY",
    "RUN_COLUMNS",
    "SCHEMA_VERSION",
    "SOURCES",
    "RunFileError",
    "RunMeta",
    "RunWriter",
    "SchemaVersionError",
    "UnreadableRunFile",
    "list_runs",
    "read_meta",
    "read_run",
    "write_run",
]

SCHEMA_VERSION: int = 1
# Versions this reader understands. A newer writer bumps SCHEMA_VERSION; an old reader
# must refuse its files rather than misread them.
KNOWN_SCHEMA_VERSIONS: tuple[int, ...] = (1,)
SOURCES: tuple[str, ...] = ("synthetic", "real", "imported", "guarded")
RUN_COLUMNS: tuple[str, ...] = ("step", *SIGNAL_NAMES, "event")
META_KEY: str = "collapse_guard"

_SIGNAL_SET = frozenset(SIGNAL_NAMES)
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


class RunFileError(ValueError):
    """A run file (or data meant for one) is not what collapse-guard expects.

    The message names the file, what is wrong and what to do about it.
    """


class UnreadableRunFile(RunFileError, UserInputError):
    """A file given to be read as a run file is damaged, foreign or too new: bad input,
    which the command line prints as one line (a writer's misuse stays a plain
    :class:`RunFileError`, a bug in the calling code)."""


class SchemaVersionError(UnreadableRunFile):
    """The file was written with a schema version this reader does not know."""


# --------------------------------------------------------------------------- metadata


@dataclass
class RunMeta:
    """What a run file says about itself (stored as JSON in the Parquet footer)."""

    run_id: str
    source: str  # one of SOURCES
    config: dict = field(default_factory=dict)  # model / optimizer settings
    onset_step: int | None = None  # first step of collapse (label.py), None if healthy
    label_version: str | None = None  # label.LABEL_VERSION that set onset_step
    schema_version: int = SCHEMA_VERSION
    extra: dict = field(default_factory=dict)  # free-form: collapse_kind, spikes, fault, ...

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not self.run_id:
            raise ValueError(f"RunMeta.run_id must be a non-empty string, got {self.run_id!r}")
        if self.source not in SOURCES:
            raise ValueError(
                f"RunMeta.source must be one of {', '.join(SOURCES)}, got {self.source!r}"
            )
        if self.onset_step is not None:
            if isinstance(self.onset_step, bool) or not isinstance(
                self.onset_step, (int, np.integer)
            ):
                raise ValueError(
                    f"RunMeta.onset_step must be an int or None, got {self.onset_step!r}"
                )
            self.onset_step = int(self.onset_step)
        if not isinstance(self.config, dict) or not isinstance(self.extra, dict):
            raise ValueError(
                "RunMeta.config and RunMeta.extra must be dicts, got "
                f"{type(self.config).__name__} and {type(self.extra).__name__}"
            )

    def to_json(self) -> str:
        """The JSON stored under ``collapse_guard`` in the file's metadata."""
        try:
            return json.dumps(asdict(self), default=_json_default, sort_keys=True)
        except TypeError as exc:
            raise RunFileError(
                f"run {self.run_id!r}: metadata is not JSON-serialisable ({exc}); "
                "store plain str/int/float/bool/list/dict values in config and extra"
            ) from None

    @classmethod
    def from_json(cls, text: str | bytes, *, path: str | os.PathLike = "<memory>") -> RunMeta:
        """Parse and validate metadata; errors name ``path`` and do not check the version."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UnreadableRunFile(
                f"{path}: the {META_KEY!r} metadata is not valid JSON ({exc}); "
                "the file is damaged: regenerate or re-import the run"
            ) from None
        if not isinstance(data, dict):
            raise UnreadableRunFile(f"{path}: the {META_KEY!r} metadata is not a JSON object")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            # A known schema version never carries unknown fields; keep them rather
            # than lose them, where a later reader can see them.
            data.setdefault("extra", {})
            data["extra"] = {**data["extra"], "_unknown_meta": {k: data[k] for k in unknown}}
            for k in unknown:
                del data[k]
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise UnreadableRunFile(f"{path}: invalid run metadata: {exc}") from None


def _json_default(value: Any) -> Any:
    """numpy scalars, arrays, paths and tuples-in-sets become plain JSON values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (os.PathLike, set, frozenset)):
        return str(value) if isinstance(value, os.PathLike) else sorted(value)
    raise TypeError(f"{type(value).__name__} value {value!r} cannot be stored as JSON")


# --------------------------------------------------------------------------- writing


def _durable_write(path: Path, table: pa.Table) -> None:
    """Write ``table`` to ``path`` so that ``path`` is always a complete file.

    tmp file in the same folder (same filesystem, so the rename is atomic) -> fsync
    -> os.replace -> fsync the folder.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as sink:
            pq.write_table(table, sink, compression=_COMPRESSION)
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
    every row handed to ``append``.
    """

    def __init__(self, path: str | os.PathLike, meta: RunMeta, *, chunk_steps: int = 256) -> None:
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

    # -- context manager
    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Also on an exception: the rows collected so far are the run's evidence.
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

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
        _durable_write(self.path, _with_meta(table, self.meta))
        self.rows_written = table.num_rows
        self._on_disk = True

    def close(self, **meta_updates: Any) -> Path:
        """Flush, apply ``meta_updates`` (e.g. ``onset_step=``), and return the path.

        ``extra=`` is merged into the existing extra dict. Idempotent: a second call
        returns the path; with new ``meta_updates`` it rewrites the metadata.
        """
        if meta_updates:
            self.update_meta(**meta_updates)
        if not (self._closed and self._on_disk):
            self.flush()
        self._closed = True
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


def write_run(path: str | os.PathLike, frame: pd.DataFrame, meta: RunMeta) -> Path:
    """Write a whole run at once (durably, replacing any file at ``path``).

    ``frame`` needs a ``step`` column; missing signal columns become NaN and a missing
    ``event`` column becomes empty strings. Unknown columns are an error.
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
    _durable_write(path, _with_meta(table, meta))
    return path


# --------------------------------------------------------------------------- reading


def _open(path: Path) -> pq.ParquetFile:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such run file")
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
