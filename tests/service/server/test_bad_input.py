"""Bad input through the service's ASGI app in process: a 4xx naming the field, never 5xx."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from helpers import run_json, window

from collapse_guard.service.client.arrow_writer import ARROW_TYPE, encode_runs
from collapse_guard.service.client.raw_run import RawRun

SIGNALS = ("loss", "grad_norm", "lr")


def good_run(run_id: str = "a", steps: int = 20) -> dict:
    return run_json(window(5, SIGNALS, steps=steps, holes=0.0), run_id)


def post(client, body, content_type="application/json", path="/risk"):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=content, headers={"Content-Type": content_type})


def with_run(**changes) -> dict:
    return {"runs": [good_run() | changes]}


def signals_with(**columns) -> dict:
    return with_run(signals=good_run()["signals"] | columns)


CASES = {
    "unknown signal": (
        signals_with(los=[1.0] * 20),
        400,
        "runs[0].signals.los",
        "loss, loss_nonfinite",
    ),
    "short column": (
        signals_with(loss=[2.5] * 19),
        400,
        "runs[0].signals.loss",
        "19 values for 20 steps",
    ),
    "steps not increasing": (
        with_run(steps=[*range(10), 5, *range(11, 20)]),
        400,
        "runs[0].steps[10]",
        "step 5 after step 9",
    ),
    "duplicate step": (
        with_run(steps=[0, 0, *range(2, 20)]),
        400,
        "runs[0].steps[1]",
        "strictly increasing",
    ),
    "window too long": (
        {"runs": [good_run(steps=4097)]},
        400,
        "runs[0].steps",
        "at most 4096 steps",
    ),
    "too many runs": (
        {"runs": [good_run(str(i), 2) for i in range(257)]},
        400,
        "runs",
        "at most 256 runs",
    ),
    "no runs": ({"runs": []}, 400, "runs", "at least 1 item"),
    "text value": (
        signals_with(loss=[2.5, 2.4, "abc", *[2.3] * 17]),
        400,
        "runs[0].signals.loss[2]",
        "NaN",
    ),
    "object value": (
        signals_with(loss=[{"v": 1}, *[2.3] * 19]),
        400,
        "runs[0].signals.loss[0]",
        "a number",
    ),
    "fractional step": (
        with_run(steps=[0.5, *range(1, 20)]),
        400,
        "runs[0].steps[0]",
        "whole number",
    ),
    "missing steps": ({"runs": [{"run_id": "a", "signals": {}}]}, 400, "runs[0].steps", "present"),
    "runs not a list": ({"runs": {"a": 1}}, 400, "runs", "array"),
    "top_k too big": (
        {"runs": [good_run()], "top_k": 51},
        400,
        "top_k",
        "less than or equal to 50",
    ),
    "unknown context": (
        with_run(context={"lr_peak": 1.0}),
        400,
        "runs[0].context.lr_peak",
        "the model's context fields: ctx__steps, ctx__lr_over_peak",
    ),
    "text context": (
        with_run(context={"ctx__steps": "many"}),
        400,
        "runs[0].context.ctx__steps",
        "a number",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_json_names_the_field(app_client, case):
    body, status, field, words = CASES[case]
    answer = post(app_client, body)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert error["field"] == field
    assert words in error["error"], error["error"]
    assert error["expected"] and error["fix"]


def test_damaged_json_and_wrong_content_type(app_client):
    broken = post(app_client, b'{"runs": [', "application/json")
    assert broken.status_code == 400 and broken.json()["field"] == "body"
    form = post(app_client, b"runs=1", "application/x-www-form-urlencoded")
    assert form.status_code == 415 and "Content-Type: application/json" in form.json()["fix"]
    missing = app_client.post("/risk", content=b"{}")
    assert missing.status_code == 415


def arrow_body(**columns) -> bytes:
    batch = pa.RecordBatch.from_pydict(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def test_bad_arrow_names_the_problem(app_client):
    good = encode_runs([RawRun("a", np.arange(10), {"loss": np.full(10, 2.5)})])
    damaged = post(app_client, good[: len(good) // 2], ARROW_TYPE)
    assert damaged.status_code == 400 and "Arrow IPC stream" in damaged.json()["error"]
    text = post(app_client, arrow_body(step=[0, 1], loss=["a", "b"]), ARROW_TYPE)
    assert text.status_code == 400 and text.json()["field"] == "arrow column 'loss'"
    no_step = post(app_client, arrow_body(loss=[2.5, 2.4]), ARROW_TYPE)
    assert no_step.status_code == 400 and no_step.json()["field"] == "arrow column 'step'"
    unknown = post(app_client, arrow_body(step=[0, 1], los=[2.5, 2.4]), ARROW_TYPE)
    assert unknown.status_code == 400 and "unknown signal" in unknown.json()["error"]
    backwards = post(app_client, arrow_body(step=[1, 0], loss=[2.5, 2.4]), ARROW_TYPE)
    assert backwards.status_code == 400 and "strictly increasing" in backwards.json()["error"]


def test_explain_takes_exactly_one_run(app_client):
    two = post(app_client, {"runs": [good_run("a"), good_run("b")]}, path="/explain")
    assert two.status_code == 400 and two.json()["expected"] == "exactly one run"


def test_bad_reload_body_and_source(app_client, default_model):
    assert post(app_client, b"[1]", path="/reload").status_code == 400
    missing = post(app_client, {"source": "/no/such/folder"}, path="/reload")
    # named by its last name only: a token holder learns no server path
    assert missing.status_code == 409 and "'.../folder'" in missing.json()["error"]
    assert "/no/such" not in missing.json()["error"]
    assert app_client.get("/model").json()["version"] == default_model.meta["version"]


def test_a_model_that_loads_but_answers_nan_is_refused(app_client, nan_dir, default_model):
    answer = post(app_client, {"source": str(nan_dir)}, path="/reload")
    assert answer.status_code == 409
    assert "failed its check" in answer.json()["error"]
    assert "not a probability in [0, 1]" in answer.json()["error"]
    assert app_client.get("/model").json()["version"] == default_model.meta["version"]


def test_non_finite_spellings_are_the_same_data(app_client):
    """null, NaN/"NaN", Infinity/"Infinity": every spelling of a value gives one answer."""
    run = good_run()
    literal = json.dumps({"runs": [run]}).replace('"Infinity"', "Infinity")
    values = run["signals"]["loss"]
    values[3], values[4] = "NaN", "Infinity"
    as_strings = post(app_client, {"runs": [run]}).json()
    values[3], values[4] = float("nan"), float("inf")
    as_literals = post(app_client, json.dumps({"runs": [run]}).encode()).json()  # NaN, Infinity
    values[3] = None
    as_null = post(app_client, {"runs": [run | {"signals": run["signals"] | {"loss": values}}]})
    assert as_strings == as_literals
    assert as_null.json()["results"][0]["probability"] == as_strings["results"][0]["probability"]
    assert post(app_client, literal.encode()).status_code == 200
