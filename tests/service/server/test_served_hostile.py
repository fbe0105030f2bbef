"""The served instance (2 workers) as a hostile or unlucky client tries it: mutated
bodies, made-up paths, stalled bodies, damaged models. Nothing may answer a 5xx or
restart a worker (asserted on the worker pids)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid

import httpx
import numpy as np
import pytest
from helpers import AUTH, TOKEN, until_every_worker_serves, window, worker_pids
from mutations import arrow_bases, json_bases, mutate
from service_settings import SERVED_IDLE_SECONDS

from collapse_guard.service import RequestRejected, RiskClient
from collapse_guard.service.client.arrow_writer import ARROW_TYPE

# cases per format; COLLAPSE_GUARD_FUZZ_CASES raises it for the benchmarks/README figures
CASES = int(os.environ.get("COLLAPSE_GUARD_FUZZ_CASES", "250"))


@pytest.fixture(scope="module")
def client(served):
    with RiskClient(served, token=TOKEN, timeout=60.0) as c:
        yield c


@pytest.fixture(scope="module")
def server(served_server):
    return served_server[1]


def _fuzz(url: str, bases: list[bytes], content_type: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    statuses: dict[int, int] = {}
    failures = []
    with httpx.Client(base_url=url, headers=AUTH | {"Content-Type": content_type}) as http:
        for case in range(CASES):
            body = mutate(bases[case % len(bases)], rng)
            path = "/explain" if case % 5 == 4 else "/risk"
            try:
                status = http.post(path, content=body, timeout=30).status_code
            except httpx.TransportError as error:  # a worker that died drops its connection
                status = -1
                failures.append((case, repr(error)))
            statuses[status] = statuses.get(status, 0) + 1
            if status >= 500:
                failures.append((case, status, body[:80]))
    return {"statuses": statuses, "failures": failures}


@pytest.mark.parametrize("kind", ["arrow", "json"])
def test_byte_mutation_fuzz_no_5xx_no_worker_restart(served, server, default_model, kind):
    signals = default_model.schema.signals
    before = worker_pids(server)
    assert len(before) == 2
    if kind == "arrow":
        found = _fuzz(served, arrow_bases(signals), ARROW_TYPE, seed=22)
    else:
        found = _fuzz(served, json_bases(signals), "application/json", seed=23)
    fives = sum(n for s, n in found["statuses"].items() if s >= 500 or s < 0)
    restarted = len(before - worker_pids(server))
    print(
        f"\n{kind} fuzz: {CASES} cases, statuses {sorted(found['statuses'].items())} "
        f"(-1: connection dropped), workers restarted {restarted}"
    )
    assert fives == 0, found["failures"][:5]
    assert restarted == 0  # no worker crashed and was restarted
    # the mutations reach the parsers, not only the envelope: some still score
    assert found["statuses"].get(200, 0) > 0 and found["statuses"].get(400, 0) > CASES // 4


def test_unknown_paths_do_not_grow_metrics(served):
    """Made-up paths without a token (all 401) are one label in /metrics, not one each."""
    with httpx.Client(base_url=served) as http:
        http.get("/x-warm-up/risk")
        before = len(http.get("/metrics", headers=AUTH).text)
        answers = {http.get(f"/x{uuid.uuid4().hex}/risk").status_code for _ in range(400)}
        text = http.get("/metrics", headers=AUTH).text
    assert answers == {401}
    assert "/x" not in text  # no raw path is a label
    # 400 paths labelled one by one added ~1.4 KB of series each (histogram buckets)
    assert len(text) - before < 4_000, len(text) - before
    assert 'endpoint="/{other}",http_response_code="401"' in text


def test_metrics_show_no_worker_pid(served, client):
    client.model_info()
    text = httpx.get(served + "/metrics", headers=AUTH).text
    assert "pid=" not in text
    assert 'worker="1"' in text and 'worker="2"' in text  # which worker serves what


def test_a_stalled_body_is_a_408_within_seconds(served):
    """Content-Length of 3 MB, 2 bytes sent, then nothing: the worker answers and lets go."""
    with socket.create_connection(("127.0.0.1", int(served.rsplit(":", 1)[1]))) as sock:
        sock.sendall(
            b"POST /risk HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b'\r\nContent-Type: application/json\r\nContent-Length: 3000000\r\n\r\n{"'
        )
        started = time.monotonic()
        sock.settimeout(30)
        answer = sock.recv(65536)
        waited = time.monotonic() - started
        while chunk := sock.recv(65536):  # the rest, up to the close the answer announces
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"connection: close" in head.lower()
    assert SERVED_IDLE_SECONDS - 0.5 < waited < SERVED_IDLE_SECONDS + 3
    assert json.loads(body)["field"] == "body" and b"2 bytes of the 3,000,000" in body


def test_model_route_shows_no_server_path_and_no_run_ids(served, default_model):
    info = httpx.get(served + "/model", headers=AUTH).json()
    text = json.dumps(info)
    assert "/tmp" not in text and os.getcwd() not in text and "real-s0-" not in text
    assert info["meta"]["train_run_ids"]["count"] == len(default_model.meta["train_run_ids"])
    assert len(info["meta"]["train_run_ids"]["sha256"]) == 16


# -------------------------------------------------------------- damaged models
@pytest.fixture(scope="module")
def damaged(tmp_path_factory, default_model):
    """The bundled model's folder three ways: model.txt cut in half, cut within its
    header, and 30 of its 71 trees removed under the same label."""
    from collapse_guard.predictor.core.risk import DEFAULT_MODEL_DIR

    root = tmp_path_factory.mktemp("damaged")
    text = (DEFAULT_MODEL_DIR / "model.txt").read_text(encoding="utf-8")
    versions = {
        "truncated": text[: len(text) // 2],
        "header": text[:5000],
        "fewer-trees": default_model.booster.model_to_string(num_iteration=41),
    }
    folders = {}
    for name, content in versions.items():
        folder = root / name
        shutil.copytree(DEFAULT_MODEL_DIR, folder)
        (folder / "model.txt").write_text(content, encoding="utf-8")
        folders[name] = folder
    return folders


@pytest.mark.parametrize("kind", ["truncated", "header"])
def test_reload_of_a_damaged_model_is_a_409_and_the_old_one_serves(
    served, server, client, damaged, default_model, kind
):
    before = worker_pids(server)
    frame = window(3, default_model.schema.signals)
    with pytest.raises(RequestRejected) as caught:
        client.reload(str(damaged[kind]))
    message = caught.value.message
    assert caught.value.status == 409 and "model.txt" in message
    assert str(damaged[kind].parent) not in message and "/tmp" not in message  # no server path
    assert f"version {default_model.meta['version']} keeps serving" in caught.value.body["fix"]
    versions = {client.risk(frame).model_version for _ in range(8)}  # both workers
    assert versions == {default_model.meta["version"]}
    assert worker_pids(server) == before  # LightGBM's abort killed a child, not a worker


def test_fewer_trees_under_the_same_label_is_served_under_another_version(
    served, client, damaged, default_model
):
    try:
        answer = client.reload(str(damaged["fewer-trees"]))
        label = default_model.meta["version"]
        assert answer.reloaded and answer.previous_version == label
        assert answer.model.version.startswith(label + "+") and answer.model.version != label
        assert answer.model.source == ".../fewer-trees"  # its name, not its server path
        assert answer.model.meta["source"] == ".../fewer-trees"  # not the checked copy
        frame = window(4, default_model.schema.signals)
        assert client.risk(frame).model_version == answer.model.version
    finally:
        client.reload("default")
        until_every_worker_serves(served, default_model.meta["version"])
