"""Runs as an Arrow IPC stream, for fleet-scale callers: the columns, and writing them.

Content type ``application/vnd.apache.arrow.stream``. Columns:

==================  =========================================================================
``step``            integer steps, strictly increasing within a run
``run_id``          string (optional): rows are grouped by it (order of first appearance);
                    without it, each record batch is one run, named by its position
                    (``"0"``, ``"1"``, ...)
``<signal>``        numeric, one per canonical signal; null or NaN: no finite value
``context.<name>``  numeric (optional): the run's context field ``name``, read from its last
                    row; null there = not given
==================  =========================================================================

:func:`encode_runs` writes one record batch with a ``run_id`` column, as the client
sends runs; the service reads any stream of these columns
(:mod:`collapse_guard.service.server.arrow_reader`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from collapse_guard.service.client.raw_run import RawRun

__all__ = ["ARROW_TYPE", "CONTEXT_PREFIX", "encode_runs"]

ARROW_TYPE = "application/vnd.apache.arrow.stream"
CONTEXT_PREFIX = "context."  # a context field's column: "context.<name>"


def encode_runs(runs: Sequence[RawRun]) -> bytes:
    """One record batch with a ``run_id`` column; signals absent from a run are NaN."""
    names = sorted({n for r in runs for n in r.columns})
    context_names = sorted({n for r in runs for n in (r.context or {})})
    lengths = [len(r.steps) for r in runs]
    arrays = [
        _run_ids(runs, lengths),
        pa.array(_joined([np.asarray(r.steps, dtype=np.int64) for r in runs])),
        *(pa.array(_signal(runs, name)) for name in names),
    ]
    for name in context_names:
        values = [(r.context or {}).get(name) for r in runs]
        column = np.repeat(np.array([np.nan if v is None else v for v in values]), lengths)
        arrays.append(pa.array(column, type=pa.float64()))
    columns = ("run_id", "step", *names, *(CONTEXT_PREFIX + n for n in context_names))
    batch = pa.RecordBatch.from_arrays(arrays, names=list(columns))
    return _schema_message(columns, batch.schema) + batch.serialize().to_pybytes() + _END


# the stream's end-of-stream marker: a continuation token and a zero length
_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_SCHEMA_MESSAGES: dict[tuple[str, ...], bytes] = {}


def _schema_message(columns: tuple[str, ...], schema: pa.Schema) -> bytes:
    """The stream's first message, by column names (their types follow from them): a
    training loop sends the same columns every call, and writing the stream through
    ``ipc.new_stream`` cost ~30 us a call more than this cache and one serialize."""
    message = _SCHEMA_MESSAGES.get(columns)
    if message is None:
        if len(_SCHEMA_MESSAGES) >= 256:  # many callers' column sets: start over
            _SCHEMA_MESSAGES.clear()
        message = _SCHEMA_MESSAGES[columns] = schema.serialize().to_pybytes()
    return message


def _signal(runs: Sequence[RawRun], name: str) -> np.ndarray:
    """A signal over every run's rows (NaN where a run lacks it)."""
    if len(runs) == 1:  # a training loop's one run: its array as it is
        return np.asarray(runs[0].columns[name], dtype=np.float64)
    return np.concatenate(
        [
            np.asarray(r.columns[name], dtype=np.float64)
            if name in r.columns
            else np.full(len(r.steps), np.nan)
            for r in runs
        ]
    )


def _run_ids(runs: Sequence[RawRun], lengths: list[int]) -> pa.Array:
    if len(runs) == 1:  # a training loop's one run: Arrow repeats the id (12 us, not 36)
        return pa.repeat(runs[0].run_id, lengths[0])
    return pa.array(np.repeat(np.array([r.run_id for r in runs], dtype=object), lengths))


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    # one run (the usual call from a training loop) is sent as it is, without a copy
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
