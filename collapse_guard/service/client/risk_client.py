"""RiskClient: ask a running risk service for the collapse risk of training runs.

>>> from collapse_guard.service import RiskClient
>>> with RiskClient("http://127.0.0.1:3000", token=None, timeout=2.0) as client:
...     result = client.risk(frame, run_id="run-7")        # frame: step + signal columns
...     result.probability, result.level, result.model_version
...     results = client.risk_many({"a": frame_a, "b": arrays_b})

A run is a pandas frame of its recent steps (a ``step`` column plus signal columns, as
the probe's records or a run file give them; ``event`` is dropped) or a dict of arrays
with the same keys. Requests are ``httpx.Request`` objects handed straight to an httpx
transport, kept open so calls reuse the connection:
:class:`~collapse_guard.service.client.transport.KeepAliveTransport` (a request in one write,
answers read by ``http.client``), or whatever ``transport=`` gives
(``httpx.HTTPTransport()`` for HTTP/2 or proxies). Not through ``httpx.Client``: its
URL merging, cookies, auth and redirect machinery cost ~0.5 ms of CPU a call here, and
the service needs none of them (measured 2026-11-30: client CPU 1.22 -> 0.69 ms a call,
p50 4.19 -> 3.67 ms; ``benchmarks/service_latency.py`` compares the transports).
Runs travel as an Arrow IPC stream (exact float64, about half JSON's bytes, and far
cheaper to write and read: one window's round trip 2-3 ms faster here); ``arrow=False``
sends the JSON body instead, e.g. through a proxy that only passes JSON.
Failures come as one small hierarchy (client/errors.py): :class:`ServiceUnavailable`
(cannot connect, connection lost, 5xx), :class:`ServiceTimeout`,
:class:`RequestRejected` (a 4xx, with the server's message) and :class:`InvalidAnswer`
(a 2xx that is not the route's answer, or longer than ``max_answer_bytes``:
:class:`AnswerTooLarge`), all :class:`RiskServiceError`.

An answer is untrusted. It is read strictly, as the wire types say and nothing looser:
``true`` or ``"0.5"`` is not a number, ``"50"`` or ``50.0`` not a step count, a level
one of the four names exactly; a probability is finite in [0, 1] and a ``hold_steps`` in
[0, ``wire.MAX_HOLD_STEPS``]. Anything else is an :class:`InvalidAnswer`, never coerced.
A request is bounded in time and size: ``timeout`` is the whole request's (connect,
send and every read of the answer together: an answer that trickles in a byte at a
time ends at it), and at most ``max_answer_bytes`` of an answer are read (one
:data:`~collapse_guard.service.client.transport.CHUNK` more at most, whatever the
transport; a declared ``Content-Length`` over it is refused before reading).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from collapse_guard.service.client.arrow_writer import ARROW_TYPE, encode_runs
from collapse_guard.service.client.errors import (
    AnswerTooLarge,
    InvalidAnswer,
    RequestRejected,
    RiskServiceError,
    ServiceTimeout,
    ServiceUnavailable,
)
from collapse_guard.service.client.json_writer import encode_json
from collapse_guard.service.client.raw_run import RawRun, as_raw_run
from collapse_guard.service.client.transport import DEADLINE, KeepAliveTransport
from collapse_guard.service.client.wire import (
    MAX_HOLD_STEPS,
    ExplainResponse,
    ModelInfo,
    ReloadResponse,
    RiskResponse,
    RiskResult,
)

__all__ = ["DEFAULT_MAX_ANSWER_BYTES", "RiskClient"]

# bytes of one answer read at most: /risk's largest, 256 runs x 50 factors of ~90 bytes, is
# about 1.2 MB (a service with a larger COLLAPSE_GUARD_MAX_RUNS: raise max_answer_bytes)
DEFAULT_MAX_ANSWER_BYTES = 8 * 1024 * 1024

_ARROW_HEADERS = {"Content-Type": ARROW_TYPE}
M = TypeVar("M", bound=BaseModel)


class RiskClient:
    """Client of one risk service.

    Args:
        url: the service's base URL, e.g. ``http://127.0.0.1:3000``.
        token: the bearer token when the service has ``COLLAPSE_GUARD_TOKEN`` set.
        timeout: seconds a request may take in all: connecting, sending and reading the
            whole answer (each phase is bounded by it too). An ``httpx.Timeout`` gives
            each phase its own limit, and the request the sum of connect, write and read
            (no total where one of them is None).
        top_k: contributing features per answer (0: none, a little faster).
        arrow: send runs as an Arrow IPC stream (default) rather than JSON.
        transport: an httpx transport (default: :class:`KeepAliveTransport`, which holds
            every socket operation to the deadline; another transport gets the per-phase
            limits, and the deadline checked between the chunks of the answer).
        max_answer_bytes: bytes of an answer read at most (default 8 MiB); a longer one
            is :class:`AnswerTooLarge`.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float | httpx.Timeout = 5.0,
        *,
        top_k: int = 5,
        arrow: bool = True,
        transport: httpx.BaseTransport | None = None,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        if type(max_answer_bytes) is not int or max_answer_bytes < 1:
            raise ValueError(
                f"max_answer_bytes={max_answer_bytes!r}: expected a whole number of bytes >= 1 "
                f"(default {DEFAULT_MAX_ANSWER_BYTES})"
            )
        self.top_k, self.arrow = top_k, arrow
        self.max_answer_bytes = max_answer_bytes
        self.url = url.rstrip("/")
        self._headers = {"Accept": "application/json", "User-Agent": "collapse-guard"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        phases = httpx.Timeout(timeout)
        self._extensions = {"timeout": phases.as_dict()}
        self.total_timeout = _total(timeout, phases)  # seconds a request may take in all
        self._transport = transport or KeepAliveTransport()
        self._urls: dict[str, httpx.URL] = {}  # path and query -> URL, parsed once

    # ---------------------------------------------------------------- scoring
    def risk(
        self,
        run: Any,
        run_id: str = "run",
        context: Mapping[str, float | None] | None = None,
    ) -> RiskResult:
        """The risk of one run (frame or dict of arrays) at its last step."""
        return self.risk_many({run_id: run}, {run_id: context} if context else None)[0]

    def risk_many(
        self,
        runs: Mapping[str, Any],
        contexts: Mapping[str, Mapping[str, float | None]] | None = None,
        *,
        arrow: bool | None = None,
    ) -> list[RiskResult]:
        """The risk of many runs (run id -> frame or dict of arrays), in order.

        ``arrow``: this call's wire format (default: the client's).
        """
        raw = [as_raw_run(run, rid, (contexts or {}).get(rid)) for rid, run in runs.items()]
        results = self._parse(self._post_runs("/risk", raw, arrow), RiskResponse).results
        if len(results) != len(raw):
            raise InvalidAnswer(
                f"{self.url}/risk answered {len(results)} results for {len(raw)} runs: "
                "expected one per run, in order; the answer is refused"
            )
        return results

    def explain(
        self, run: Any, run_id: str = "run", context: Mapping[str, float | None] | None = None
    ) -> ExplainResponse:
        """Every feature's contribution for one run's window, grouped by signal."""
        response = self._post_runs("/explain", [as_raw_run(run, run_id, context)])
        return self._parse(response, ExplainResponse)

    # ------------------------------------------------------------------ admin
    def model_info(self) -> ModelInfo:
        return self._parse(self._send("GET", "/model"), ModelInfo)

    def reload(self, source: str | None = None) -> ReloadResponse:
        """Ask the service to load ``source`` (default: its start-up source) and swap it in."""
        body = json.dumps({"source": source} if source else {}).encode()
        return self._parse(self._send_json("/reload", body), ReloadResponse)

    def ready(self) -> bool:
        """True when the service answers its readiness probe."""
        try:
            return self._send("GET", "/readyz").status_code == 200
        except RiskServiceError:
            return False

    # -------------------------------------------------------------- transport
    def _post_runs(self, path: str, raw: Sequence[RawRun], arrow: bool | None = None) -> _Answer:
        if self.arrow if arrow is None else arrow:
            # the query written here, not as params=: httpx merges params into the URL
            # in Python, ~0.3 ms a call here
            return self._send(
                "POST",
                f"{path}?top_k={self.top_k}",
                content=encode_runs(raw),
                headers=_ARROW_HEADERS,
            )
        return self._send_json(path, encode_json(raw, self.top_k))

    def _send_json(self, path: str, body: bytes) -> _Answer:
        return self._send("POST", path, content=body, headers={"Content-Type": "application/json"})

    def _send(
        self,
        method: str,
        path: str,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> _Answer:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self.url + path)
        extensions = self._extensions
        deadline = None
        if self.total_timeout is not None:
            deadline = time.monotonic() + self.total_timeout
            extensions = {**extensions, DEADLINE: deadline}
        request = httpx.Request(
            method,
            url,
            headers={**self._headers, **(headers or {})},
            content=content,
            extensions=extensions,
        )
        where = f"{self.url}{path.split('?')[0]}"
        with _mapped_errors(self.url):
            response = self._transport.handle_request(request)
            try:
                body = self._read(response, where, deadline)
            finally:
                response.close()
        answer = _Answer(response.status_code, body, where)
        if answer.status_code >= 500:
            text = body[:300].decode("utf-8", "replace")
            raise ServiceUnavailable(f"{self.url} answered HTTP {answer.status_code}: {text}")
        if answer.status_code >= 400:
            try:
                error = json.loads(body)
            except ValueError:
                error = {"error": body[:300].decode("utf-8", "replace")}
            error = error if isinstance(error, dict) else {"error": str(error)[:300]}
            raise RequestRejected(answer.status_code, str(error.get("error"))[:1000], error)
        return answer

    def _read(self, response: httpx.Response, where: str, deadline: float | None) -> bytes:
        """The answer's body: at most ``max_answer_bytes`` (one chunk more at most),
        and by the deadline, whatever the transport."""
        limit = self.max_answer_bytes
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > limit:
            raise AnswerTooLarge(
                f"{where} answered Content-Length {declared}: expected at most "
                f"{limit} bytes; the answer is refused unread (raise "
                "RiskClient(max_answer_bytes=) if answers are that long)"
            )
        if response.is_stream_consumed:  # a transport that read the body already
            chunks = [response.content]
        else:
            chunks = []
            size = 0
            for chunk in response.iter_raw():
                size += len(chunk)
                chunks.append(chunk)
                if size > limit:
                    raise AnswerTooLarge(
                        f"{where} answered more than {limit} bytes: the answer is refused "
                        "after that many (raise RiskClient(max_answer_bytes=) if answers "
                        "are that long)"
                    ) from None
                if deadline is not None and time.monotonic() > deadline:
                    raise ServiceTimeout(
                        f"{where}: the answer was not complete within the client's "
                        f"{self.total_timeout:g} s ({size} bytes read)"
                    )
        body = b"".join(chunks)
        if len(body) > limit:
            raise AnswerTooLarge(f"{where} answered {len(body)} bytes: expected at most {limit}")
        if deadline is not None and time.monotonic() > deadline:
            raise ServiceTimeout(f"{where}: no whole answer within {self.total_timeout:g} s")
        return body

    def _parse(self, answer: _Answer, model: type[M]) -> M:
        """The answer as ``model``, read strictly (module docstring), or InvalidAnswer."""
        try:
            parsed = model.model_validate_json(answer.content, strict=True)
        except ValidationError as error:
            raise InvalidAnswer(
                f"{answer.where} answered HTTP {answer.status_code} with what is not a "
                f"{model.__name__}: {_first_problems(error)}; the answer is refused, never "
                "coerced (is the URL a collapse-guard risk service? GET /model says)"
            ) from None
        for found in _checked_fields(parsed):
            raise InvalidAnswer(f"{answer.where} answered {found}; the answer is refused")
        return parsed

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> RiskClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def _mapped_errors(url: str) -> Iterator[None]:
    try:
        yield
    except httpx.TimeoutException as error:
        raise ServiceTimeout(
            f"{url}: no whole answer within the client's timeout ({type(error).__name__}: "
            f"{error}); raise RiskClient(timeout=) if the service is this slow"
        ) from error
    except httpx.TransportError as error:
        raise ServiceUnavailable(f"{url}: {type(error).__name__}: {error}") from error


class _Answer(NamedTuple):
    """A read answer: its status, its whole body and where it came from (for errors)."""

    status_code: int
    content: bytes
    where: str


def _total(timeout: float | httpx.Timeout | None, phases: httpx.Timeout) -> float | None:
    """Seconds a request may take in all (RiskClient's ``timeout``)."""
    if timeout is None or isinstance(timeout, (int, float)):
        return None if timeout is None else float(timeout)
    parts = (phases.connect, phases.write, phases.read)
    return None if any(p is None for p in parts) else float(sum(parts))  # type: ignore[arg-type]


def _first_problems(error: ValidationError, shown: int = 3) -> str:
    """The validation errors as ``field: message (got ...)``, the first few, each short."""
    problems = []
    for item in error.errors(include_url=False)[:shown]:
        field = ".".join(str(part) for part in item["loc"]) or "the body"
        got = repr(item.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        problems.append(f"{field}: {item['msg'].lower()} (got {got})")
    more = error.error_count() - shown
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")


def _checked_fields(parsed: BaseModel) -> Iterator[str]:
    """What a well-typed answer holds out of range: a probability not finite in [0, 1],
    a hold_steps not in [0, MAX_HOLD_STEPS]."""
    if isinstance(parsed, RiskResponse):
        items: list[tuple[str, Any]] = [(f"results.{i}", r) for i, r in enumerate(parsed.results)]
    elif isinstance(parsed, ReloadResponse):
        items = [("model", parsed.model)]
    else:
        items = [("", parsed)]
    for where, item in items:
        prefix = f"{where}." if where else ""
        p = getattr(item, "probability", None)
        if p is not None and not (math.isfinite(p) and 0.0 <= p <= 1.0):
            yield f"{prefix}probability {p!r}: expected a number in [0, 1]"
        hold = getattr(item, "hold_steps", None)
        if hold is not None and not 0 <= hold <= MAX_HOLD_STEPS:
            yield f"{prefix}hold_steps {hold!r}: expected a whole number in [0, {MAX_HOLD_STEPS}]"
