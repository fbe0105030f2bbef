"""Everything the guard reads from the network is untrusted: a 200 answer out of range is
garbage (the embedded model scores, one warning, training goes on), and an answer whose
level is not its probability's is acted on by the probability (and said once).

The service is a real HTTP server on 127.0.0.1 answering fixed bytes, read by the real
``RiskClient``: the bytes a broken or hostile service could send.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard
from collapse_guard.guard.risk_source import MAX_HOLD_STEPS, GarbageAnswer, read_answer
from collapse_guard.runfiles import read_run

GOOD = {
    "run_id": "run",
    "step": 9,
    "probability": 0.02,
    "level": "ok",
    "horizon": 200,
    "hold_steps": 0,
    "model_name": "stand-in",
    "model_version": "v-test",
    "top_factors": [],
}


class _Loopback:
    """A ``ThreadingHTTPServer`` on a free loopback port, serving from a thread of its own."""

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FixedAnswers(_Loopback):
    """A loopback HTTP server whose /risk answers 200 with ``result`` (raw JSON text, so
    NaN and wrong types get through), /model with ``model`` (404 without), /readyz 200,
    and anything else 404."""

    def __init__(self, result: str, model: dict | None = None) -> None:
        body = f'{{"results": [{result}]}}'.encode()
        info = json.dumps(model).encode() if model else None
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.requests += self.path.startswith("/risk")
                self._answer(200, body) if self.path.startswith("/risk") else self._answer(
                    404, b'{"error": "no such route"}'
                )

            def do_GET(self) -> None:
                if self.path == "/model" and info:
                    return self._answer(200, info)
                ready = self.path == "/readyz"
                self._answer(200 if ready else 404, b"{}" if ready else b'{"error": "none"}')

            def log_message(self, *args) -> None:
                pass

        self._serve(Handler)


def _answer(**fields) -> str:
    return json.dumps({**GOOD, **fields})


def _guarded(tmp_path, risk_model, result: str, steps: int = 20):
    from collapse_guard.service.client import RiskClient

    server = FixedAnswers(result)
    client = RiskClient(server.url, timeout=2.0, top_k=0)
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk=client, policy={"risk_every": 5})
    guard.risk.fallback.model = risk_model  # the session's copy: no second load
    loop = Loop()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            guard.step(loop.loss(model))
            opt.zero_grad()
        guard.close()
    server.close()
    said = [str(w.message) for w in caught if "collapse-guard:" in str(w.message)]
    return guard, server, said


@pytest.mark.parametrize(
    "result",
    [
        _answer(hold_steps=-5),  # issue 22: raised ValueError out of guard.step at step 10
        _answer(hold_steps=10**9),
        _answer(probability=1.5),
        _answer(probability=-0.1),
        _answer(level="panic"),
        _answer(probability=[0.5]),
        _answer(hold_steps="fifty"),
        '{"run_id": "run", "step": 9, "probability": NaN, "level": "ok", "horizon": 200, '
        '"hold_steps": 0, "model_name": "m", "model_version": "v", "top_factors": []}',
    ],
    ids=["hold-5", "hold1e9", "p1.5", "p-0.1", "level", "p-list", "hold-str", "pNaN"],
)
def test_a_garbage_200_answer_falls_back_with_one_warning_and_training_goes_on(
    tmp_path, risk_model, result
):
    guard, server, said = _guarded(tmp_path, risk_model, result)
    assert guard.step_index == 20 and server.requests >= 1
    failed = [m for m in said if "risk service failed" in m]
    assert len(failed) == 1, said
    assert guard.risk_source == "fallback" and guard.risk.failures >= 1
    assert len(read_run(guard.run_path)[0]) == 20  # the run file is written


def _two_readings(risk_model, server: FixedAnswers) -> tuple[list, list[str], int]:
    """Two windows through ServiceSource and the real client: the readings, the warnings
    about levels, and how many answers disagreed."""
    import pandas as pd

    from collapse_guard.guard.risk_source import EmbeddedRisk, ServiceSource
    from collapse_guard.service.client import RiskClient

    source = ServiceSource(RiskClient(server.url, timeout=5.0, top_k=0), EmbeddedRisk(risk_model))
    frame = pd.DataFrame({"step": range(30), "loss": [2.5] * 30})
    readings = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (29, 39):
            source.submit(step, frame.assign(step=frame.step + step - 29), None)
            deadline = time.monotonic() + 30
            while not (reading := source.poll()) and time.monotonic() < deadline:
                time.sleep(0.01)
            readings.append(reading)
        source.poll()  # the note of the answers' disagreement is given here at the latest
    source.close()
    server.close()
    told = [str(w.message) for w in caught if "answered level" in str(w.message)]
    return [(r.source, r.probability, r.level) for r in readings], told, source.disagreements


@pytest.mark.parametrize(
    ("probability", "level", "acted"),
    [(0.01, "critical", "ok"), (0.99, "ok", "critical")],
)
def test_a_level_that_is_not_its_probabilitys_is_corrected_and_said_once(
    risk_model, probability, level, acted
):
    # /model answers 404 here: the embedded model's thresholds judge the probability
    assert risk_model.level(probability) == acted
    server = FixedAnswers(_answer(probability=probability, level=level))
    readings, told, disagreements = _two_readings(risk_model, server)
    assert readings == [("service", probability, acted)] * 2
    assert len(told) == 1 and f"level {level!r}" in told[0] and f"call {acted!r}" in told[0]
    assert disagreements == 2


def test_a_collapse_now_answer_is_acted_on_by_its_forecast_without_a_warning(risk_model):
    # the service's critical for a measured NaN loss comes with a reason; the guard's own
    # reactive path has that loss, so it acts on the probability's level and says nothing
    assert risk_model.level(0.01) == "ok"
    server = FixedAnswers(_answer(probability=0.01, level="critical", reason="loss is NaN"))
    readings, told, disagreements = _two_readings(risk_model, server)
    assert readings == [("service", 0.01, "ok")] * 2
    assert told == [] and disagreements == 0


def test_the_services_own_thresholds_judge_its_answers(risk_model):
    # a model levelled for another set-up: p = 0.01 is critical there, ok for the embedded
    thresholds = {"watch": 0.002, "warn": 0.005, "critical": 0.009}
    schema = {"version": "1", "window": 200, "signals": [], "context": [], "fingerprint": "f"}
    model = {
        "name": "stand-in",
        "version": GOOD["model_version"],
        "alias": None,
        "source": "default",
        "horizon": 200,
        "hold_steps": 0,
        "feature_schema": {**schema, "names": []},
        "levels": ["ok", "watch", "warn", "critical"],
        "thresholds": thresholds,
        "budgets": {},
        "trained_at": None,
        "evaluation": {},
        "meta": {},
    }
    server = FixedAnswers(_answer(probability=0.01, level="critical"), model)
    readings, told, disagreements = _two_readings(risk_model, server)
    assert readings == [("service", 0.01, "critical")] * 2
    assert told == [] and disagreements == 0


def test_read_answer_takes_only_a_risk():
    good = SimpleNamespace(probability=0.3, level="warn", hold_steps=50)
    assert read_answer(good) == (0.3, "warn", 50)
    for bad in (
        {"probability": True},
        {"probability": "0.3"},
        {"probability": float("inf")},
        {"level": None},
        {"level": "WARN"},
        {"hold_steps": 50.0},
        {"hold_steps": False},
        {"hold_steps": MAX_HOLD_STEPS + 1},
    ):
        with pytest.raises(GarbageAnswer, match="garbage answer"):
            read_answer(SimpleNamespace(**{**vars(good), **bad}))
    with pytest.raises(GarbageAnswer):
        read_answer(SimpleNamespace(probability=0.3, level="ok"))  # no hold_steps at all


# ------------------------------------------- issue 31: answers coerced, answers unbounded
class HostileAnswers(_Loopback):
    """A loopback HTTP server whose /risk answers 200 with 50 MB of an unfinished JSON
    body (no Content-Length: read until the close) or one byte every 0.5 s (``kind``
    ``"huge"`` or ``"trickle"``); ``arrivals`` are the monotonic times of its requests."""

    def __init__(self, kind: str) -> None:
        self.arrivals: list[float] = []
        self.stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.arrivals.append(time.monotonic())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if kind == "huge":
                    self.send_header("Connection", "close")
                else:
                    self.send_header("Content-Length", "100000")
                self.end_headers()
                try:
                    if kind == "huge":
                        self.wfile.write(b'{"results": ["')
                        for _ in range(50 * 16):  # 50 MB in 64 KiB writes
                            self.wfile.write(b"x" * 65536)
                    else:
                        while not owner.stop.wait(0.5):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                except OSError:  # the client gave up, as it should
                    pass
                self.close_connection = True

            def do_GET(self) -> None:
                self.send_response(404)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:
                pass

        self._serve(Handler)

    def close(self) -> None:
        self.stop.set()
        super().close()


def _service_guarded(tmp_path, risk_model, risk, steps: int = 20):
    """A guarded loop with ``Guard(risk=risk)``: its decisions, the guard and the
    collapse-guard warnings given."""
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk=risk, policy={"risk_every": 5})
    guard.risk.fallback.model = risk_model  # the session's copy, as the embedded model
    loop = Loop()
    decisions = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            _answered(guard.risk)
            decisions.append(guard.step(loop.loss(model)))
            opt.zero_grad()
        guard.close()
    said = [str(w.message) for w in caught if "collapse-guard:" in str(w.message)]
    return decisions, guard, said


def _answered(source, limit: float = 20.0) -> None:
    """Wait while a request is in flight: on a loaded machine the tiny loop's next window
    came before the answer, and "still busy" (not the answer's fault) was what failed."""
    deadline = time.monotonic() + limit
    while getattr(source, "_busy", False) and time.monotonic() < deadline:
        time.sleep(0.005)


@pytest.mark.parametrize(
    "result",
    [
        _answer(probability=True, level="critical"),  # was read as 1.0 and acted on
        _answer(probability="0.5"),
        _answer(hold_steps="50"),
        _answer(probability=1, level="critical", step="9"),
    ],
    ids=["p-true-critical", "p-str", "hold-str", "step-str"],
)
def test_an_answer_a_lax_reader_would_coerce_is_refused_and_never_acted_on(
    tmp_path, risk_model, result
):
    from collapse_guard.guard import ServiceRisk

    server = FixedAnswers(result)
    try:
        decisions, guard, said = _service_guarded(
            tmp_path, risk_model, ServiceRisk(server.url, timeout=2.0)
        )
    finally:
        server.close()
    assert server.requests >= 1 and guard.step_index == 20
    # the embedded model's levels on this loop (at most watch), never the refused critical
    assert len(decisions) == 20 and all(d.level in ("ok", "watch") for d in decisions)
    assert guard.risk_source == "fallback" and guard.risk.failures >= 1
    failed = [m for m in said if "risk service failed" in m]
    assert len(failed) == 1 and "InvalidAnswer" in failed[0], said


@pytest.mark.parametrize("kind", ["huge", "trickle"])
def test_a_50_MB_or_trickling_answer_ends_within_the_timeout_and_training_goes_on(
    tmp_path, risk_model, kind
):
    from collapse_guard.guard import ServiceRisk

    timeout = 2.0
    server = HostileAnswers(kind)
    try:
        decisions, guard, said = _service_guarded(
            tmp_path, risk_model, ServiceRisk(server.url, timeout=timeout)
        )
        # each request ends by its deadline, and close() drops a request still waiting,
        # so the source's thread ends within the timeout (+ 1 s) of the last request it
        # made (a trickle never ends on its own)
        left = server.arrivals[-1] + timeout + 1.0 - time.monotonic()
        guard.risk._thread.join(timeout=max(0.0, left))
        assert not guard.risk._thread.is_alive()
    finally:
        server.close()
    assert guard.step_index == 20 and server.arrivals
    assert all(d.level in ("ok", "watch") for d in decisions)  # the embedded model's
    assert guard.risk_source == "fallback"
    assert len([m for m in said if "risk service failed" in m]) == 1, said
    assert len(read_run(guard.run_path)[0]) == 20


def test_the_guard_and_the_client_read_hold_steps_with_one_bound():
    from collapse_guard.service.client.wire import MAX_HOLD_STEPS as CLIENT_BOUND

    assert MAX_HOLD_STEPS == CLIENT_BOUND


def test_thresholds_from_the_service_are_numbers_in_0_1_rising_or_none():
    # the guard reads a service's levels through the one level rule
    from collapse_guard.predictor.core.levels import thresholds_or_none as _thresholds

    good = {"watch": 0.1, "warn": 0.2, "critical": 0.3}
    assert _thresholds(good) == good
    for bad in (
        {"watch": "0.1"},  # a string is no number
        {"watch": True},
        {"critical": 1.5},  # over 1: the level could never fire
        {"watch": 0.0},
        {"watch": float("nan")},
        {"warn": 0.05},  # not rising
    ):
        assert _thresholds({**good, **bad}) is None, bad
    assert _thresholds({"watch": 0.1, "warn": 0.2}) is None
