"""Every route of a real served instance (2 workers, bearer token), through RiskClient."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest
from helpers import TOKEN, context_of, run_json, window
from service_settings import SERVED_BODY_LIMIT

from collapse_guard.service import RequestRejected, RiskClient
from collapse_guard.service.client import as_raw_run, encode_json
from collapse_guard.service.server.scoring import signal_of


@pytest.fixture(scope="module")
def client(served):
    with RiskClient(served, token=TOKEN, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="module")
def frames(default_model):
    signals = default_model.schema.signals
    return {f"run-{s}": window(s, signals, steps=150 + 20 * s) for s in range(6)}


def embedded(model, frame, context=None):
    # a request without context is scored with NaN context features (context={})
    return model.predict_window(frame, context=context or {})


def test_risk_equals_the_embedded_model_to_the_bit(client, frames, default_model):
    results = client.risk_many(frames)
    assert [r.run_id for r in results] == list(frames)
    for r, frame in zip(results, frames.values(), strict=True):
        p = embedded(default_model, frame)
        assert r.probability == p  # exact: same features, same booster, same calibration
        assert r.level == default_model.level(p)
        assert r.step == int(frame["step"].iloc[-1])
        assert r.horizon == default_model.horizon == 200
        assert r.hold_steps == default_model.hold_steps == 50  # how long a loop holds it
        assert r.model_version == default_model.meta["version"]
        sizes = [abs(f.contribution) for f in r.top_factors]
        assert len(sizes) == 5 and sizes == sorted(sizes, reverse=True)
        assert all(signal_of(f.feature) == f.signal for f in r.top_factors)


def test_arrow_gives_the_same_answers_as_json(client, frames):
    # a signal with no value in the window: Arrow sends its NaNs, JSON leaves it out
    frames = {k: f.assign(sharpness=np.nan) for k, f in frames.items()}
    assert b'"sharpness":' not in encode_json([as_raw_run(f, k) for k, f in frames.items()], 5)
    as_json = client.risk_many(frames, arrow=False)
    as_arrow = client.risk_many(frames)
    assert [r.model_dump() for r in as_arrow] == [r.model_dump() for r in as_json]


def test_context_is_used_as_given_json_and_arrow(client, frames, default_model):
    """The run's context, computed over the whole run, travels with its last window."""
    runs = {k: f.iloc[-60:] for k, f in frames.items()}  # the caller sends recent steps
    contexts = {k: context_of(f, default_model) for k, f in frames.items()}
    contexts["run-1"] = {}  # none known: NaN features, as without "context"
    first = next(iter(contexts["run-0"]))
    contexts["run-4"] = contexts["run-4"] | {first: None}  # null: not known
    for arrow in (False, True):
        results = client.risk_many(runs, contexts, arrow=arrow)
        for r, (name, frame) in zip(results, runs.items(), strict=True):
            given = {k: v for k, v in contexts[name].items() if v is not None}
            assert r.probability == embedded(default_model, frame, given), (arrow, name)
    # the context features are the values sent, or NaN (null) when none was sent
    explained = client.explain(runs["run-0"], context=contexts["run-0"])
    sent = {f.feature: f.value for s in explained.signals for f in s.features}
    for name, value in contexts["run-0"].items():
        assert sent[name] == (value if math.isfinite(value) else None), name
    bare = client.explain(runs["run-0"])
    assert all(f.value is None for s in bare.signals if s.signal == "context" for f in s.features)


def test_explain_adds_up_to_the_models_log_odds(client, frames, default_model):
    frame = frames["run-2"]
    answer = client.explain(frame, run_id="run-2")
    X = default_model.extractor.transform_window(frame, {})[np.newaxis, :]
    raw = float(default_model.booster.predict(X, raw_score=True, num_threads=1)[0])
    assert math.isclose(answer.log_odds, raw, rel_tol=0, abs_tol=1e-9)
    total = answer.base_log_odds + sum(s.contribution for s in answer.signals)
    assert math.isclose(total, raw, rel_tol=0, abs_tol=1e-9)
    assert answer.probability == embedded(default_model, frame)
    n_features = sum(len(s.features) for s in answer.signals)
    assert n_features == len(default_model.schema.names)
    sizes = [abs(s.contribution) for s in answer.signals]
    assert sizes == sorted(sizes, reverse=True)


def test_model_route_describes_the_serving_model(client, default_model):
    info = client.model_info()
    assert info.version == default_model.meta["version"]
    assert info.source == "default" and info.alias is None
    assert info.feature_schema.fingerprint == default_model.schema.fingerprint
    assert info.feature_schema.names == list(default_model.schema.names)
    assert info.thresholds == default_model.thresholds
    assert info.hold_steps == default_model.hold_steps == 50
    assert info.levels == ["ok", "watch", "warn", "critical"]
    assert info.trained_at == default_model.meta["trained_at"]
    assert "split" not in info.meta  # hundreds of run ids: bookkeeping, not information


def test_token_guards_every_route_but_health(served):
    for method, path in [
        ("POST", "/risk"),
        ("GET", "/model"),
        ("POST", "/reload"),
        ("GET", "/metrics"),
    ]:
        assert httpx.request(method, served + path).status_code == 401, path
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.request(method, served + path, headers=wrong).status_code == 403, path
    for path in ("/livez", "/readyz"):
        assert httpx.get(served + path).status_code == 200, path
    with RiskClient(served) as anonymous, pytest.raises(RequestRejected) as caught:
        anonymous.model_info()
    assert caught.value.status == 401 and "COLLAPSE_GUARD_TOKEN" in caught.value.message


def test_bodies_over_the_limit_get_413_with_or_without_content_length(served):
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    body = b" " * (SERVED_BODY_LIMIT + 1)
    sized = httpx.post(served + "/risk", content=body, headers=headers, timeout=30)
    assert sized.status_code == 413 and "at most 4,000,000 bytes" in sized.json()["error"]

    def chunks():  # a generator: httpx sends it chunked, without Content-Length
        for _ in range(5):
            yield b" " * (SERVED_BODY_LIMIT // 4)

    chunked = httpx.post(served + "/risk", content=chunks(), headers=headers, timeout=30)
    assert chunked.status_code == 413 and chunked.json()["field"] == "body"


def test_rejections_reach_the_client_with_the_servers_message(client):
    bad = {"step": [0, 1, 2], "los": [2.5, 2.4, 2.3]}
    for arrow, field in ((False, "runs[0].signals.los"), (True, "arrow run 'typo'.signals.los")):
        with pytest.raises(RequestRejected) as caught:
            client.risk_many({"typo": bad}, arrow=arrow)
        error = caught.value
        assert error.status == 400 and error.field == field
        assert "unknown signal" in error.message and "loss" in error.message


def test_own_metrics_count_windows_by_level_and_version(client, served, frames, default_model):
    results = client.risk_many(frames)
    text = httpx.get(served + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    version = default_model.meta["version"]
    for level in {r.level for r in results}:
        line = f'collapse_guard_windows_total{{level="{level}",model_version="{version}"}}'
        assert line in text, text[-2000:]
    assert f'model_version="{version}"' in text and "collapse_guard_model_info" in text
    assert 'collapse_guard_requests_total{route="/risk",status="200"}' in text


def test_openapi_document_lists_the_routes_and_both_body_types(served):
    doc = httpx.get(served + "/docs.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    for path in ("/risk", "/explain", "/model", "/reload", "/livez", "/readyz", "/metrics"):
        assert path in doc["paths"], sorted(doc["paths"])
    content = doc["paths"]["/risk"]["post"]["requestBody"]["content"]
    assert set(content) == {"application/json", "application/vnd.apache.arrow.stream"}
    assert "runs" in content["application/json"]["schema"]["properties"]
    assert "RiskResponse" in doc["components"]["schemas"]


def test_curl_style_request_with_string_non_finite_values(served, frames, default_model):
    frame = frames["run-3"]  # seed 3: a measured +inf loss, sent as "Infinity"
    body = {"runs": [run_json(frame, "curl")]}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    answer = httpx.post(served + "/risk", json=body, headers=headers, timeout=30).json()
    assert answer["results"][0]["probability"] == embedded(default_model, frame)
