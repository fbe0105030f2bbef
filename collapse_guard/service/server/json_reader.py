"""A ``/risk`` JSON body read straight into arrays, for the plain form of the wire format.

pydantic makes a Python float of every number and numpy then copies them into arrays:
~50 ms of a 64-window body's ~70 ms of CPU here (5.7 MB, 300,000 numbers; 2-core
machine, 2026-11-30). simdjson parses the body in C++ and hands each column over as a
buffer of doubles, with no Python object per number.

Only the plain form is read here: objects without repeated keys, ``run_id`` a string,
``steps`` a flat array of whole numbers, signal values a flat array of numbers or
``null``, context values numbers or ``null``, ``top_k`` a whole number 0..50, at least
one run and one step (booleans are none of these). Anything else (the string or literal spellings of
non-finite values, numbers written as strings, a malformed body) gives None and the
caller reads the body with the ``RiskRequest`` model, which accepts the rest and names
what is wrong. Both readers give the same runs for a plain body (tested, and fuzzed).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import simdjson

from collapse_guard.service.client.raw_run import RawRun
from collapse_guard.service.client.wire import MAX_TOP_K, RiskRequest

__all__ = ["read_plain_json"]

_DEFAULT_TOP_K = RiskRequest.model_fields["top_k"].default
_NUMBER_OR_NULL = frozenset({float, int, type(None)})  # bool is not int here: type() is exact


_local = threading.local()


def _parser() -> simdjson.Parser:
    """This thread's parser: a new one per body cost ~5 ms of a 64-window body here
    (it sizes its buffers to the body). A parser can take a new body only once nothing
    of the last one is referenced: this module keeps none past its return."""
    if not hasattr(_local, "parser"):
        _local.parser = simdjson.Parser()
    return _local.parser


class _NotPlain(Exception):
    """The body is not in the plain form: the pydantic reader takes it."""


def read_plain_json(body: bytes) -> tuple[list[RawRun], Any] | None:
    """The runs and ``top_k`` of a plain ``/risk`` body, or None for any other body."""
    try:
        document = _parser().parse(body)
    except (ValueError, RuntimeError, TypeError):  # RuntimeError: parser still in use
        return None
    try:
        root = _object(document)
        runs = root["runs"] if "runs" in root else None
        if not isinstance(runs, simdjson.Array):
            return None
        top_k = root["top_k"] if "top_k" in root else _DEFAULT_TOP_K
        if type(top_k) is not int or not 0 <= top_k <= MAX_TOP_K or not len(runs):
            return None
        plain = [_run(_object(runs[i])) for i in range(len(runs))]
        if not _only_arrays_of_numbers(body, 1 + sum(1 + len(r.columns) for r in plain)):
            return None
        return plain, top_k
    # anything simdjson itself refuses on the way, too: the general reader says what
    except (_NotPlain, ValueError, TypeError, KeyError, IndexError, RuntimeError):
        return None


def _only_arrays_of_numbers(body: bytes, arrays: int) -> bool:
    """Whether the body opens exactly ``arrays`` arrays (runs, then each run's steps and
    columns): simdjson's buffers flatten nested arrays (``[[2.5], [2.4]]`` reads as two
    numbers), which the schema forbids. A ``[`` inside a string also counts: that body
    goes to the general reader, which reads it correctly, only slower. One ``find`` per
    array (memchr): ~2 ms of a 64-window body here, ``bytes.count`` took ~7."""
    at = body.find(b"[")
    while at >= 0 and arrays >= 0:
        arrays -= 1
        at = body.find(b"[", at + 1)
    return arrays == 0 and at < 0


def _object(value: Any) -> Any:
    if not isinstance(value, simdjson.Object):
        raise _NotPlain
    keys = list(value.keys())
    if len(keys) != len(set(keys)):  # which of a repeated key counts differs by reader
        raise _NotPlain
    return value


def _run(run: Any) -> RawRun:
    run_id = run["run_id"] if "run_id" in run else None
    if type(run_id) is not str or "steps" not in run or "signals" not in run:
        raise _NotPlain
    signals = _object(run["signals"])
    columns = {name: _numbers(signals[name]) for name in signals.keys()}
    context = run["context"] if "context" in run else None
    steps = _whole_numbers(run["steps"])
    if not len(steps):  # the schema asks for one step at least
        raise _NotPlain
    return RawRun(run_id, steps, columns, _context(context))


def _whole_numbers(value: Any) -> np.ndarray:
    try:
        return np.frombuffer(value.as_buffer(of_type="i"), dtype=np.int64)
    except (AttributeError, TypeError, ValueError):
        raise _NotPlain from None


def _numbers(value: Any) -> np.ndarray:
    """float64 of a list of numbers and nulls (null: NaN, as numpy and the model read it)."""
    if not isinstance(value, simdjson.Array):
        raise _NotPlain
    # a probe's sparse column (measured every 10th step, null between) has a null at one
    # of its first two places: the buffer call would fail on it, at the cost of an
    # exception (~8 us; 640 such columns in the benchmark's 64 windows)
    if len(value) < 2 or (value[0] is not None and value[1] is not None):
        try:
            return np.frombuffer(value.as_buffer(of_type="d"), dtype=np.float64)
        except TypeError:  # not all doubles: nulls, whole numbers, or something else
            pass
    items = value.as_list()
    if not set(map(type, items)) <= _NUMBER_OR_NULL:  # in C: a generator took 8x longer
        raise _NotPlain
    try:
        # None becomes NaN; measured in a whole body's loop, this beat replacing the
        # Nones in Python first (the 64-window body: 37-47 ms against 42-46)
        return np.array(items, dtype=np.float64)
    except OverflowError:  # a whole number beyond float64: pydantic says so
        raise _NotPlain from None


def _context(context: Any) -> dict[str, float | None] | None:
    if context is None:
        return None
    items = _object(context).as_dict()
    if not set(map(type, items.values())) <= _NUMBER_OR_NULL:
        raise _NotPlain
    return {k: None if v is None else float(v) for k, v in items.items()}
