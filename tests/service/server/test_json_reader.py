"""The plain-JSON reader gives exactly the runs the pydantic model gives, or leaves the
body to it: never different numbers, never a body it accepts and pydantic refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from collapse_guard.service.client.wire import RiskRequest
from collapse_guard.service.server.json_reader import read_plain_json


def _same_as_pydantic(body: bytes) -> bool:
    """Whether the plain reader read ``body`` (asserting it agrees with pydantic)."""
    plain = read_plain_json(body)
    if plain is None:
        return False
    runs, top_k = plain
    model = RiskRequest.model_validate_json(body)  # accepts whatever the reader accepted
    assert top_k == model.top_k and len(runs) == len(model.runs)
    for run, ref in zip(runs, model.runs, strict=True):
        assert run.run_id == ref.run_id
        assert np.array_equal(run.steps, np.asarray(ref.steps, dtype=np.int64))
        assert list(run.columns) == list(ref.signals)
        for name, values in ref.signals.items():
            want = np.asarray(values, dtype=np.float64)
            assert run.columns[name].dtype == np.float64
            assert np.array_equal(run.columns[name], want, equal_nan=True)
            assert np.array_equal(np.signbit(run.columns[name]), np.signbit(want))
        assert run.context == ref.context
    return True


def test_a_plain_body_is_read_as_pydantic_reads_it():
    rng = np.random.default_rng(3)
    values = rng.normal(size=50) * 10.0 ** rng.integers(-300, 300, 50)
    run = {
        "run_id": "a",
        "steps": list(range(100, 150)),
        "signals": {
            "loss": values.tolist(),
            "grad_norm": [None if i % 7 == 0 else float(i) for i in range(50)],
            "lr": [3] * 25 + [-0.0] * 25,  # whole numbers, negative zero
        },
        "context": {"ctx__lr_over_peak": 0.5, "ctx__x": None, "ctx__y": 2},
    }
    assert _same_as_pydantic(json.dumps({"runs": [run]}).encode())
    two = {"runs": [run, run | {"run_id": "b"}], "top_k": 0}
    assert _same_as_pydantic(json.dumps(two).encode())


@pytest.mark.parametrize(
    "body",
    [
        b'{"runs": [{"run_id": "a", "steps": [1], "signals": {"loss": [NaN]}}]}',
        b'{"runs": [{"run_id": "a", "steps": [1], "signals": {"loss": ["NaN"]}}]}',
        b'{"runs": [{"run_id": "a", "steps": [1], "signals": {"loss": ["2.5"]}}]}',
        b'{"runs": [{"run_id": "a", "steps": [1], "signals": {"loss": [true]}}]}',
        b'{"runs": [{"run_id": "a", "steps": [1], "signals": {"loss": [1], "loss": [2]}}]}',
        b'{"runs": [{"run_id": 7, "steps": [1], "signals": {"loss": [1]}}]}',
        b'{"runs": [{"run_id": "a", "steps": [1.0], "signals": {"loss": [1]}}]}',
        b'{"runs": [{"run_id": "a", "steps": [1], "signals": {"loss": [1]}}], "top_k": true}',
        b'{"runs": [{"run_id": "a", "steps": [1], "signals": {"loss": 1}}]}',
        b'{"runs": [{"run_id": "a", "steps": [1], "signals": [1]}]}',
        b'{"runs": [{"run_id": "a", "steps": [1], "signals": {"loss": [1e999]}}]}',
        b'{"runs": {"run_id": "a"}}',
        b'{"runs": [{"run_id": "a", "steps": [1]',
        b"[]",
        b"",
    ],
)
def test_any_other_body_is_left_to_pydantic(body):
    assert read_plain_json(body) is None


_number = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**70), 2**70),
    st.none(),
    st.booleans(),
    st.text(max_size=3),
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "run_id": st.one_of(st.text(max_size=5), st.integers()),
                "steps": st.lists(st.one_of(st.integers(-5, 2**63 - 1), st.floats()), max_size=4),
                "signals": st.dictionaries(
                    st.sampled_from(["loss", "lr", "x"]), st.lists(_number, max_size=4)
                ),
            },
            optional={"context": st.dictionaries(st.text(max_size=3), _number, max_size=2)},
        ),
        min_size=1,
        max_size=3,
    ),
    st.one_of(st.none(), st.integers(-3, 60)),
)
def test_fuzzed_bodies_read_alike_or_not_at_all(runs, top_k):
    body = {"runs": runs} | ({} if top_k is None else {"top_k": top_k})
    encoded = json.dumps(body).encode()
    try:
        RiskRequest.model_validate_json(encoded)
    except ValidationError:
        assert read_plain_json(encoded) is None  # what pydantic refuses, it refuses too
        return
    _same_as_pydantic(encoded)


def test_the_parser_takes_the_next_body_after_one_it_left_to_pydantic():
    plain = b'{"runs": [{"run_id": "a", "steps": [1, 2], "signals": {"loss": [1.5, null]}}]}'
    odd = b'{"runs": [{"run_id": "a", "steps": [1, 2], "signals": {"loss": [1.5, true]}}]}'
    for _ in range(3):
        assert read_plain_json(odd) is None  # given up half way through the document
        runs, _ = read_plain_json(plain)
        assert runs[0].columns["loss"][0] == 1.5 and np.isnan(runs[0].columns["loss"][1])
