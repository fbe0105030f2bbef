"""A request's runs as one batch: the Arrow stream decoded whole gives the batch of the
run-by-run checks, and a batch scores each run as the model scores it alone, whatever
the runs' lengths, gaps and missing signals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from collapse_guard.service.client.arrow_writer import encode_runs
from collapse_guard.service.client.raw_run import RawRun
from collapse_guard.service.client.wire import RiskResponse
from collapse_guard.service.middleware.bad_request import BadRequest
from collapse_guard.service.middleware.limits import Limits
from collapse_guard.service.server.arrow_reader import decode_runs
from collapse_guard.service.server.scoring import ServedModel, answers_json
from collapse_guard.service.server.window_checks import check_window
from collapse_guard.service.server.windows import WindowBatch


def _runs(signals, context_fields) -> list[RawRun]:
    """Short, whole (exactly one window), long and gapped runs; signals missing in some."""
    rng = np.random.default_rng(7)
    runs = []
    for i, n in enumerate((5, 200, 200, 260, 85, 230)):
        step = 1 if i in (1, 2) else rng.integers(1, 3, n)  # gaps in all but the whole ones
        steps = np.cumsum(np.broadcast_to(step, n)) + 100 * i
        kept = signals if i in (1, 2) else signals[: 3 + 4 * i]
        columns = {s: rng.normal(size=n) for s in kept}
        columns[signals[0]][::7] = np.nan
        columns[signals[0]][3] = np.inf  # a measured non-finite value is data
        context = {context_fields[0]: None if i % 2 else 0.5 * i} if context_fields else None
        runs.append(RawRun(f"run-{i}", steps, columns, context))
    return runs


def _shape(model) -> dict:
    signals, fields = tuple(model.schema.signals), tuple(model.schema.context)
    return {"signals": signals, "context_fields": fields, "limits": Limits()}


def _checked(run: RawRun, shape: dict):
    return check_window(run.run_id, run.run_id, run.steps, run.columns, run.context, **shape)


def test_arrow_stream_decodes_to_the_batch_of_the_run_by_run_checks(default_model):
    shape = _shape(default_model)
    runs = _runs(shape["signals"], shape["context_fields"])
    got = decode_runs(encode_runs(runs), **shape)
    want = WindowBatch.of([_checked(r, shape) for r in runs], shape["context_fields"])
    assert got.run_ids == want.run_ids == [r.run_id for r in runs]
    assert np.array_equal(got.steps, want.steps) and got.steps.dtype == np.int64
    assert np.array_equal(got.bounds, want.bounds)
    assert np.array_equal(got.contexts, want.contexts, equal_nan=True)
    assert got.contexts.shape == (len(runs), len(shape["context_fields"]))
    # a signal some runs lack is NaN on their rows in both
    assert set(got.columns) == set(want.columns)
    for name in got.columns:
        assert np.array_equal(got.columns[name], want.columns[name], equal_nan=True)


def test_a_batch_scores_each_run_as_the_model_alone(default_model):
    shape = _shape(default_model)
    runs = _runs(shape["signals"], shape["context_fields"])
    scorer = ServedModel(default_model, "m", "v")
    answers = scorer.answers(decode_runs(encode_runs(runs), **shape), top_k=3)
    results = RiskResponse.model_validate_json(answers_json(answers)).results
    for run, result in zip(runs, results, strict=True):
        frame = _checked(run, shape).frame()
        context = {k: v for k, v in (run.context or {}).items() if v is not None}
        assert result.probability == default_model.predict_window(frame, context=context)
        assert result.step == int(run.steps[-1])
        assert len(result.top_factors) == 3


def test_answers_are_the_risk_response_schema(default_model):
    shape = _shape(default_model)
    runs = _runs(shape["signals"], shape["context_fields"])
    scorer = ServedModel(default_model, "name-x", "version-y")
    answers = scorer.answers(decode_runs(encode_runs(runs), **shape), top_k=2)
    body = answers_json(answers)
    typed = RiskResponse.model_validate_json(body)
    # every field the schema has, nothing else, numbers unchanged by the round trip
    assert json.loads(typed.model_dump_json()) == json.loads(body)
    assert [r.model_version for r in typed.results] == ["version-y"] * len(runs)
    assert [r.probability for r in typed.results] == [a["probability"] for a in answers]


def test_a_step_going_back_in_one_run_is_still_named(default_model):
    shape = _shape(default_model)
    runs = _runs(shape["signals"], shape["context_fields"])
    runs[3].steps[10] = runs[3].steps[9]
    with pytest.raises(BadRequest) as error:
        decode_runs(encode_runs(runs), **shape)
    assert error.value.body()["field"] == "arrow run 'run-3'.steps[10]"


def test_interleaved_rows_are_grouped_by_run_in_order_of_first_appearance(default_model):
    import pyarrow as pa

    shape = _shape(default_model)
    runs = _runs(shape["signals"], shape["context_fields"])[1:3]  # two whole runs
    body = encode_runs(runs)
    table = pa.ipc.open_stream(body).read_all()
    # rows alternate between the runs; each run's rows keep their order
    order = np.ravel(np.column_stack([np.arange(200), 200 + np.arange(200)]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.take(order))
    got = decode_runs(sink.getvalue().to_pybytes(), **shape)
    want = decode_runs(body, **shape)
    assert got.run_ids == want.run_ids == ["run-1", "run-2"]
    assert np.array_equal(got.steps, want.steps) and np.array_equal(got.bounds, want.bounds)
    for name in want.columns:
        assert np.array_equal(got.columns[name], want.columns[name], equal_nan=True)
