"""The Arrow IPC stream of a ``/risk`` body read into checked run windows.

The columns are the client's (:mod:`collapse_guard.service.client.arrow_writer`). The
bytes are untrusted: every column of every record batch is validated in full
(offsets inside their buffers, lengths, UTF-8) before any compute function reads it,
and a column name given twice is refused, so a damaged or hostile stream is a 400 naming
the column, never a crash of the worker. Before anything is decoded, each message's
header is read here (:func:`_check_headers`): compressed or dictionary batches are
refused (a 49 KB zstd body decompressed into 1.6 GB), and so is a batch of more rows
than a request may hold. Every run then goes through the same checks as
JSON (:func:`window_checks.check_window`).
Parsing is columnar: a batch of 64 windows costs a few milliseconds instead of the ~45 ms
JSON numbers take to parse (middleware/limits.py).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute  # makes pa.compute available

from collapse_guard.service.client.arrow_writer import CONTEXT_PREFIX
from collapse_guard.service.middleware.bad_request import BadRequest
from collapse_guard.service.middleware.limits import Limits
from collapse_guard.service.server.collapse_now import reasons_of
from collapse_guard.service.server.window_checks import (
    check_batch_size,
    check_window,
    steps_in_range,
)
from collapse_guard.service.server.windows import WindowBatch
from collapse_guard.signals import SIGNAL_NAMES

__all__ = ["decode_runs"]

_KNOWN = frozenset(SIGNAL_NAMES)
_FIX = "write the stream with pyarrow.ipc.new_stream (or send runs with RiskClient)"


def _read(body: bytes, limits: Limits) -> list[pa.RecordBatch]:
    try:
        _check_headers(body, limits.max_runs * limits.max_steps)
        reader = pa.ipc.open_stream(pa.BufferReader(body))
        batches = list(reader)
        names = reader.schema.names  # UnicodeDecodeError (a ValueError): not UTF-8
    except (pa.ArrowException, OSError, ValueError) as error:
        raise BadRequest(
            "body",
            f"not a readable Arrow IPC stream ({str(error)[:200]})",
            "an Arrow IPC stream (application/vnd.apache.arrow.stream)",
            _FIX,
        ) from None
    _check_names(names)
    for batch in batches:
        _validate(batch)
    return batches


# Arrow's IPC framing and Message flatbuffer (format/Message.fbs): fields read here
_CONTINUATION = 0xFFFFFFFF
_RECORD_BATCH, _DICTIONARY_BATCH = 3, 2  # MessageHeader union types
_HEADER_TYPE, _HEADER, _BODY_LENGTH = 1, 2, 3  # Message's fields
_LENGTH, _COMPRESSION = 0, 3  # RecordBatch's fields


def _check_headers(body: bytes, max_rows: int) -> None:
    """Refuse compressed, dictionary and oversized record batches, from their headers,
    before Arrow decodes (and decompresses) any of them: the stream's framing and each
    message's flatbuffer read here with ``struct`` (~10 us a window; pyarrow's
    MessageReader took ~130). Raises BadRequest, or ValueError for framing that is
    not a stream's."""
    at = 0
    try:
        while at < len(body):
            size = _u32(body, at)
            if size == _CONTINUATION:
                at += 4
                size = _u32(body, at)
            at += 4
            if size == 0:  # the end-of-stream marker
                return
            root = at + _u32(body, at)
            kind_at = _field(body, root, _HEADER_TYPE)
            kind = body[kind_at] if kind_at else 0
            length_at = _field(body, root, _BODY_LENGTH)
            data = struct.unpack_from("<q", body, length_at)[0] if length_at else 0
            if kind in (_RECORD_BATCH, _DICTIONARY_BATCH):
                header_at = _field(body, root, _HEADER)
                _check_batch(body, header_at + _u32(body, header_at), kind, max_rows)
            if size < 0 or data < 0:
                raise ValueError
            at += size + data
    except (struct.error, IndexError, ValueError):
        raise ValueError("message framing or headers that cannot be read") from None


def _check_batch(body: bytes, header: int, kind: int, max_rows: int) -> None:
    compressed = kind == _RECORD_BATCH and bool(_field(body, header, _COMPRESSION))
    if kind == _DICTIONARY_BATCH or compressed:
        raise BadRequest(
            "arrow stream",
            "a compressed record batch" if compressed else "a dictionary-encoded column",
            "plain (uncompressed, not dictionary-encoded) columns",
            "write the stream without IpcWriteOptions(compression=...) and cast "
            "dictionary columns to their values",
        )
    length_at = _field(body, header, _LENGTH)
    rows = struct.unpack_from("<q", body, length_at)[0] if length_at else 0
    if not 0 <= rows <= max_rows:
        raise BadRequest(
            "arrow stream",
            f"a record batch of {rows} rows",
            f"at most {max_rows} rows (runs x steps a request may hold)",
            "split the runs into several requests",
        )


def _u32(buffer: bytes, at: int) -> int:
    if at < 0:  # struct would count from the end
        raise ValueError
    return struct.unpack_from("<I", buffer, at)[0]


def _field(buffer: bytes, table: int, index: int) -> int:
    """Where field ``index`` of the flatbuffer table at ``table`` is (0: absent)."""
    if table < 0:
        raise ValueError
    vtable = table - struct.unpack_from("<i", buffer, table)[0]
    if vtable < 0:
        raise ValueError
    size = struct.unpack_from("<H", buffer, vtable)[0]
    if 4 + 2 * index >= size:
        return 0
    offset = struct.unpack_from("<H", buffer, vtable + 4 + 2 * index)[0]
    return table + offset if offset else 0


def _check_names(names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise BadRequest(
                f"arrow column {name!r}",
                f"{names.count(name)} columns named {name!r}",
                "each column name once",
                "drop or rename the repeated column",
            )
        seen.add(name)


def _validate(batch: pa.RecordBatch) -> None:
    """Full validation of every column (native code trusts what it reads: a string
    column whose offsets point past its data crashed a worker in ``run_end_encode``).
    One call for the batch, ~25 us a window and ~250 for 64 here (mostly the UTF-8 of
    the run ids), cheaper than choosing columns; the column is named only on failure."""
    try:
        batch.validate(full=True)
        return
    except (pa.ArrowException, ValueError):
        pass
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        try:
            column.validate(full=True)
        except (pa.ArrowException, ValueError) as error:
            raise BadRequest(
                f"arrow column {name!r}",
                f"damaged data ({str(error)[:200]})",
                "a column whose buffers hold what its type and length say",
                _FIX,
            ) from None
    raise BadRequest(
        "arrow stream",
        f"a record batch of {batch.num_rows} rows that does not match its columns",
        "columns of the batch's length",
        _FIX,
    )


def _floats(name: str, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
        raise BadRequest(
            f"arrow column {name!r}",
            f"type {column.type}",
            "a numeric column (float64; null or NaN where there is no finite value)",
            "cast the column to float64",
        )
    if column.type != pa.float64():  # a cast is a compute call: ~8 us a column, 23 a window
        column = column.cast(pa.float64())
    return column.to_numpy(zero_copy_only=False)


def _steps(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if not pa.types.is_integer(column.type) or column.null_count:
        raise BadRequest(
            "arrow column 'step'",
            f"type {column.type} with {column.null_count} nulls",
            "integer steps, no nulls",
            "cast the step column to int64",
        )
    # in range before int64: a uint64 step of 2**64 - 1 is not "step -1"
    return steps_in_range("arrow column 'step'", column.to_numpy(zero_copy_only=False))


def _grouped(batches: list[pa.RecordBatch]) -> tuple[pa.Table, list[tuple[str, int, int]]]:
    """One table whose runs are contiguous, and each run as (run id, first row, rows):
    by the ``run_id`` column, else one run per record batch."""
    try:
        table = pa.Table.from_batches(batches)
    except (pa.ArrowException, ValueError) as error:
        raise BadRequest(
            "arrow stream",
            f"record batches that do not share one schema ({str(error)[:200]})",
            "every batch with the same columns",
            "give every batch the same columns (null where a run lacks a signal)",
        ) from None
    names = table.schema.names  # (Table.column_names takes ~35 us: 7x longer)
    if "step" not in names:
        raise BadRequest(
            "arrow column 'step'",
            f"columns {names}",
            "a 'step' column plus one column per signal",
            "add the training step as an integer column 'step'",
        )
    if "run_id" not in names:
        starts = np.cumsum([0] + [b.num_rows for b in batches])
        return table, [(str(i), int(starts[i]), b.num_rows) for i, b in enumerate(batches)]
    ids = table.column("run_id")
    if not pa.types.is_string(ids.type) or ids.null_count:
        raise BadRequest(
            "arrow column 'run_id'",
            f"type {ids.type} with {ids.null_count} nulls",
            "a string run id on every row",
            "cast run_id to string and fill it on every row",
        )
    # each run's rows together (as encode_runs writes them): its stretches of equal ids
    # are the runs, ~2x cheaper than grouping by a dictionary of the ids
    stretches = pa.compute.run_end_encode(ids.combine_chunks())
    uniques = stretches.values.to_pylist()
    ends = stretches.run_ends.to_numpy().astype(np.int64)
    if len(set(uniques)) != len(uniques):  # interleaved: bring each run's rows together
        encoded = pa.compute.dictionary_encode(ids).combine_chunks()  # by first appearance
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        table = table.take(pa.array(np.argsort(codes, kind="stable")))
        uniques, ends = encoded.dictionary.to_pylist(), np.cumsum(np.bincount(codes))
    counts = np.diff(ends, prepend=0)
    return table, [
        (str(run_id), int(end - count), int(count))
        for run_id, end, count in zip(uniques, ends, counts, strict=True)
    ]


def decode_runs(
    body: bytes, *, signals: Sequence[str], context_fields: Sequence[str], limits: Limits
) -> WindowBatch:
    """The checked runs of an Arrow IPC stream (BadRequest naming what is wrong).

    Each column is converted once for the whole stream and stays whole: the batch's
    runs are row ranges of it (converting per run cost 35 ms for 64 runs, slicing 0.6).
    """
    batches = _read(body, limits)
    if not batches:
        check_batch_size(0, limits, where="arrow stream")
    table, runs = _grouped(batches)
    check_batch_size(len(runs), limits, where="arrow stream")
    names = [n for n in table.schema.names if n not in ("step", "run_id")]
    steps = _steps(table.column("step"))
    columns = {n: _floats(n, table.column(n)) for n in names if not n.startswith(CONTEXT_PREFIX)}
    contexts = {
        n.removeprefix(CONTEXT_PREFIX): _floats(n, table.column(n))
        for n in names
        if n.startswith(CONTEXT_PREFIX)
    }
    stream = _Stream(steps, runs, columns, contexts)
    if not _plain(stream, context_fields, limits):
        _raise_first_error(stream, signals, context_fields, limits)
    bounds = np.array([start for _, start, _ in runs] + [len(steps)], dtype=np.int64)
    last = bounds[1:] - 1
    absent = np.full(len(runs), np.nan)
    return WindowBatch(
        run_ids=[run_id for run_id, _, _ in runs],
        steps=steps,
        bounds=bounds,
        columns={n: columns[n] for n in signals if n in columns},
        # a run's context is its last row's (NaN there: not given, as a JSON null)
        contexts=np.array(
            [contexts[f][last] if f in contexts else absent for f in context_fields]
        ).T.reshape(len(runs), len(context_fields)),  # also for a model without context
        reasons=reasons_of(steps, bounds, columns),
    )


@dataclass(frozen=True)
class _Stream:
    """A decoded stream before its checks: every row's step, the runs as (run id, first
    row, rows), the signal and context columns over every row."""

    steps: np.ndarray
    runs: list[tuple[str, int, int]]
    columns: Mapping[str, np.ndarray]
    contexts: Mapping[str, np.ndarray]


def _raise_first_error(
    stream: _Stream, signals: Sequence[str], context_fields: Sequence[str], limits: Limits
) -> None:
    """The error of the first run :func:`window_checks.check_window` refuses, with its message
    (as for JSON); a stream :func:`_plain` refused always has one."""
    steps, columns, contexts = stream.steps, stream.columns, stream.contexts
    for run_id, start, count in stream.runs:
        rows = slice(start, start + count)
        last = start + count - 1
        context = {k: None if np.isnan(v[last]) else float(v[last]) for k, v in contexts.items()}
        check_window(
            f"arrow run {run_id!r}",
            run_id,
            steps[rows],
            {n: c[rows] for n, c in columns.items()},
            context if count else {},
            signals=signals,
            context_fields=context_fields,
            limits=limits,
        )
    raise AssertionError("_plain refused a stream whose every run passes check_window")


def _plain(stream: _Stream, context_fields: Sequence[str], limits: Limits) -> bool:
    """Whether every run passes :func:`window_checks.check_window`, checked for the whole stream
    at once: ~60 us a run less than checking run by run (64 runs: ~4 ms here)."""
    counts = np.array([count for _, _, count in stream.runs])
    if counts.min() < 1 or counts.max() > limits.max_steps:
        return False
    if set(stream.columns) - _KNOWN or set(stream.contexts) - set(context_fields):
        return False
    # strictly increasing within each run: every step after the previous one, but at
    # the first row of a run (the previous row is another run's)
    rising = np.diff(stream.steps) > 0
    rising[np.cumsum(counts)[:-1] - 1] = True
    return bool(rising.all())
