"""An Arrow stream whose runs all pass is checked once for the whole stream: the windows
are exactly those of the run-by-run checks (which still give every error message)."""

from __future__ import annotations

import numpy as np
import pytest

import collapse_guard.service.arrow_codec as arrow_codec
from collapse_guard.service.arrow_codec import RawRun, decode_runs, encode_runs
from collapse_guard.service.errors import BadRequest
from collapse_guard.service.limits import Limits


def _runs(signals, context_fields) -> list[RawRun]:
    rng = np.random.default_rng(7)
    runs = []
    for i in range(6):
        n = 5 + 40 * i
        steps = np.cumsum(rng.integers(1, 3, n)) + 100 * i  # gaps in some runs
        columns = {s: rng.normal(size=n) for s in signals[: 3 + i]}
        columns[signals[0]][::7] = np.nan
        context = {context_fields[0]: None if i % 2 else 0.5 * i} if context_fields else None
        runs.append(RawRun(f"run-{i}", steps, columns, context))
    return runs


def test_whole_stream_check_gives_the_run_by_run_windows(default_model, monkeypatch):
    signals, fields = tuple(default_model.schema.signals), tuple(default_model.schema.context)
    body = encode_runs(_runs(signals, fields))
    shape = {"signals": signals, "context_fields": fields, "limits": Limits()}
    fast = decode_runs(body, **shape)
    monkeypatch.setattr(arrow_codec, "_plain", lambda *args: False)
    checked = decode_runs(body, **shape)
    assert [w.run_id for w in fast] == [w.run_id for w in checked]
    for a, b in zip(fast, checked, strict=True):
        assert a.steps.dtype == b.steps.dtype and np.array_equal(a.steps, b.steps)
        assert list(a.columns) == list(b.columns)
        for name in a.columns:
            assert np.array_equal(a.columns[name], b.columns[name], equal_nan=True)
        assert a.context == b.context


def test_a_step_going_back_in_one_run_is_still_named(default_model):
    signals, fields = tuple(default_model.schema.signals), tuple(default_model.schema.context)
    runs = _runs(signals, fields)
    runs[3].steps[10] = runs[3].steps[9]
    with pytest.raises(BadRequest) as error:
        decode_runs(encode_runs(runs), signals=signals, context_fields=fields, limits=Limits())
    assert error.value.body()["field"] == "arrow run 'run-3'.steps[10]"
