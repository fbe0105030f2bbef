"""Bodies that once crashed a worker, answered a 500 or were read as something else, through
the decoders and the in-process app: each is a 400 naming the column or field."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from collapse_guard.service.client.arrow_writer import ARROW_TYPE
from collapse_guard.service.middleware.bad_request import BadRequest
from collapse_guard.service.middleware.limits import Limits
from collapse_guard.service.server.arrow_reader import decode_runs
from collapse_guard.service.server.json_reader import read_plain_json

SHAPE = {"signals": ("loss", "grad_norm"), "context_fields": (), "limits": Limits()}


def stream(*batches: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def batch(**columns) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))


def offsets_past_the_data() -> bytes:
    """A run_id string column whose last offset points 1 GiB past its 8 bytes of data
    (the shape of the 568-byte body that crashed a worker in run_end_encode)."""
    good = batch(run_id=pa.array(["aa"] * 4), step=pa.array(np.arange(4)), loss=pa.array([2.5] * 4))
    body = bytearray(stream(good))
    offsets = np.array([0, 2, 4, 6, 8], np.int32).tobytes()
    at = body.find(offsets)
    assert at > 0
    body[at : at + 20] = np.array([0, 2, 4, 6, 1 << 30], np.int32).tobytes()
    return bytes(body)


def post(client, body: bytes, content_type: str, path: str = "/risk"):
    return client.post(path, content=body, headers={"Content-Type": content_type})


def test_string_offsets_past_the_data_are_a_400_naming_the_column(app_client):
    body = offsets_past_the_data()
    with pytest.raises(BadRequest) as caught:
        decode_runs(body, **SHAPE)
    assert caught.value.field == "arrow column 'run_id'" and "out of bounds" in caught.value.got
    answer = post(app_client, body, ARROW_TYPE)
    assert answer.status_code == 400 and answer.json()["field"] == "arrow column 'run_id'"


@pytest.mark.parametrize("name", ["step", "loss", "run_id"])
def test_a_column_name_given_twice_is_a_400_naming_it(app_client, name):
    columns = {
        "run_id": pa.array(["a", "a"]),
        "step": pa.array([0, 1]),
        "loss": pa.array([2.5, 2.4]),
    }
    arrays, names = [*columns.values(), columns[name]], [*columns, name]
    body = stream(pa.RecordBatch.from_arrays(arrays, names=names))
    answer = post(app_client, body, ARROW_TYPE)
    assert answer.status_code == 400, answer.text
    assert answer.json()["field"] == f"arrow column {name!r}"
    assert "2 columns named" in answer.json()["error"]


@pytest.mark.parametrize(
    ("steps", "where", "named"),
    [
        (
            pa.array([5, 2**64 - 1], pa.uint64()),
            "arrow column 'step'[1]",
            "step 18446744073709551615",
        ),
        (pa.array([2**63 + 5], pa.uint64()), "arrow column 'step'[0]", "step 9223372036854775813"),
        (
            pa.array([2**63 - 1, -(2**63)], pa.int64()),
            "arrow column 'step'[0]",
            "9223372036854775807",
        ),
    ],
)
def test_arrow_steps_out_of_range_are_named_by_their_value(steps, where, named):
    body = stream(batch(step=steps, loss=pa.array([2.5] * len(steps))))
    with pytest.raises(BadRequest) as caught:
        decode_runs(body, **SHAPE)
    assert caught.value.field == where and named in str(caught.value)
    assert "step -1" not in str(caught.value)


def test_a_uint64_step_in_range_is_read_as_it_is():
    body = stream(batch(step=pa.array([7, 8, 9], pa.uint64()), loss=pa.array([2.5, 2.4, 2.3])))
    assert decode_runs(body, **SHAPE).steps.tolist() == [7, 8, 9]


RUN = {"run_id": "a", "steps": [0, 1, 2], "signals": {"loss": [2.5, 2.4, 2.3]}}


@pytest.mark.parametrize(
    ("steps", "field", "words"),
    [
        ([0, 1, 2**63], "runs[0].steps[2]", "step 9223372036854775808"),
        ([-(2**63) - 1, 1, 2], "runs[0].steps[0]", "step -9223372036854775809"),
        # int64's ends: their difference overflowed and [2**63 - 1, -2**63] was "rising"
        ([2**63 - 1, -(2**63), 0], "runs[0].steps[0]", "step 9223372036854775807"),
    ],
)
def test_json_steps_out_of_range_are_named_by_their_value(app_client, steps, field, words):
    answer = post(
        app_client, json.dumps({"runs": [RUN | {"steps": steps}]}).encode(), "application/json"
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["field"] == field and words in answer.json()["error"]


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"signals": {"loss": [[2.5, 2.4], 2.3]}}, "runs[0].signals.loss[0]", "valid number"),
        ({"signals": {"loss": [[2.5], [2.4], [2.3]]}}, "runs[0].signals.loss[0]", "valid number"),
        ({"signals": {"loss": [True, 2.4, 2.3]}}, "runs[0].signals.loss[0]", "not a boolean"),
        ({"steps": [0, True, 2]}, "runs[0].steps[1]", "valid integer"),
        ({"steps": [[0, 1], 2]}, "runs[0].steps[0]", "valid integer"),
        ({"context": {"ctx__steps": False}}, "runs[0].context.ctx__steps", "not a boolean"),
    ],
)
def test_json_the_schema_forbids_is_a_400_from_either_reader(app_client, change, field, words):
    body = json.dumps({"runs": [RUN | change]}).encode()
    assert read_plain_json(body) is None  # the fast reader leaves it to the general one
    answer = post(app_client, body, "application/json")
    assert answer.status_code == 400, answer.text
    assert answer.json()["field"] == field and words in answer.json()["error"]


@pytest.mark.parametrize("path", ["/risk", "/explain"])
def test_boolean_top_k_and_steps_are_refused_on_both_routes(app_client, path):
    for body in ({"runs": [RUN], "top_k": True}, {"runs": [RUN | {"steps": [False, True, 2]}]}):
        answer = post(app_client, json.dumps(body).encode(), "application/json", path)
        assert answer.status_code == 400, (path, body, answer.text)


def test_plain_bodies_still_take_the_fast_reader():
    body = json.dumps({"runs": [RUN, RUN | {"run_id": "b"}], "top_k": 0}).encode()
    runs, top_k = read_plain_json(body)
    assert [r.run_id for r in runs] == ["a", "b"] and top_k == 0
    assert runs[0].columns["loss"].tolist() == [2.5, 2.4, 2.3]


def test_compressed_dictionary_and_oversized_batches_are_refused_before_decoding():
    """A 49 KB zstd body held 1.6 GB of zeros: refused from its header, unread."""
    rows = 20_000_000
    zeros = batch(step=pa.array(np.zeros(rows, np.int64)), loss=pa.array(np.zeros(rows)))
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, zeros.schema, options=options) as writer:
        writer.write_batch(zeros)
    bomb = sink.getvalue().to_pybytes()
    assert len(bomb) < 200_000 < zeros.nbytes
    small = {"step": pa.array(np.arange(3)), "loss": pa.array([2.5, 2.4, 2.3])}
    dictionary = batch(run_id=pa.array(["a"] * 3).dictionary_encode(), **small)
    many = Limits().max_runs * Limits().max_steps + 1
    oversized = batch(step=pa.array(np.arange(many)), loss=pa.array(np.zeros(many)))
    for body, words in (
        (bomb, "a compressed record batch"),
        (stream(dictionary), "a dictionary-encoded column"),
        (stream(oversized), f"a record batch of {many} rows"),
    ):
        with pytest.raises(BadRequest) as caught:
            decode_runs(body, **SHAPE)
        assert caught.value.field == "arrow stream" and caught.value.got == words
    assert len(decode_runs(stream(batch(**small), batch(**small)), **SHAPE)) == 2


def test_a_column_name_that_is_not_utf8_is_a_400():
    """The fuzz's one 500 after the header checks: a schema whose field name is bytes."""
    body = bytearray(stream(batch(step=pa.array([0, 1]), loss=pa.array([2.5, 2.4]))))
    at = body.find(b"loss")
    body[at : at + 4] = b"\xff\xfe\xfd\xfc"
    with pytest.raises(BadRequest) as caught:
        decode_runs(bytes(body), **SHAPE)
    assert caught.value.field == "body" and "utf-8" in caught.value.got
