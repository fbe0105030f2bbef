"""Hypothesis on the request model: whatever the body, the answer is never a 5xx."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collapse_guard.signals import SIGNAL_NAMES

values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "2.5", "abc", ""]),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.lists(st.integers(), max_size=2),
)
names = st.one_of(st.sampled_from(SIGNAL_NAMES), st.text(max_size=8))
steps = st.one_of(
    st.lists(st.integers(min_value=-(2**65), max_value=2**65), max_size=30),
    st.lists(st.one_of(st.floats(), st.text(max_size=3), st.none()), max_size=5),
    st.integers(),
)
runs = st.fixed_dictionaries(
    {"run_id": st.one_of(st.text(max_size=5), st.integers()), "steps": steps},
    optional={
        "signals": st.dictionaries(names, st.lists(values, max_size=30), max_size=4),
        "context": st.one_of(st.none(), st.dictionaries(st.text(max_size=6), values, max_size=2)),
    },
)
bodies = st.one_of(
    st.fixed_dictionaries(
        {"runs": st.lists(runs, max_size=3)},
        optional={"top_k": st.one_of(st.integers(), st.text(max_size=3))},
    ),
    st.recursive(st.none() | st.floats() | st.text(max_size=5), st.lists, max_leaves=5),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, path=st.sampled_from(["/risk", "/explain"]))
def test_no_json_body_gets_a_5xx(app_client, body, path):
    content = json.dumps(body).encode()  # NaN/Infinity as literals, as Python writes them
    answer = app_client.post(path, content=content, headers={"Content-Type": "application/json"})
    assert answer.status_code < 500, (answer.status_code, answer.text[:500])
    if answer.status_code != 200:
        assert answer.json()["error"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=300))
def test_no_arrow_body_gets_a_5xx(app_client, body):
    headers = {"Content-Type": "application/vnd.apache.arrow.stream"}
    answer = app_client.post("/risk", content=body, headers=headers)
    assert 400 <= answer.status_code < 500, answer.text[:300]
