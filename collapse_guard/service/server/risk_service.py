"""The risk service: a BentoML 1.4 service whose routes are a mounted FastAPI app.

    collapse-guard serve --model models:/collapse-predictor@champion --workers 2
    COLLAPSE_GUARD_MODEL=... bentoml serve collapse_guard.service.server.risk_service:RiskService

(``collapse_guard.service.service:RiskService``, its old name, still serves it for a release.)

Routes: ``POST /risk`` (JSON or Arrow), ``POST /explain``, ``GET /model``,
``POST /reload``, and BentoML's ``/livez``, ``/readyz``, ``/metrics``, ``/docs.json``.
The routes are FastAPI class views rather than ``@bentoml.api`` methods because
``/risk`` must choose its parser by Content-Type (BentoML's API methods parse every
body as JSON) and every bad input must answer with our own message (BentoML answers
validation errors with pydantic's list). BentoML still runs the server, the workers,
its health routes, metrics and OpenAPI document (the mounted routes are merged in).

Environment (read by every worker):

=============================  ==============================================================
``COLLAPSE_GUARD_MODEL``       model source: ``default`` (bundled), a folder, ``models:/...``
``COLLAPSE_GUARD_TOKEN``       bearer token for every route but the health probes
``COLLAPSE_GUARD_POLL``        seconds between checks of a models:/ alias (0: off)
``COLLAPSE_GUARD_WORKERS``     worker processes (read when this module is imported)
``COLLAPSE_GUARD_RELOAD_*``    the workers' private reload channel (``reload_channel``)
``COLLAPSE_GUARD_MAX_*``       limits, and ``COLLAPSE_GUARD_BODY_IDLE_SECONDS`` (``Limits``)
=============================  ==============================================================
"""

from __future__ import annotations

import os

# Before lightgbm is imported: spinning OpenMP threads stall a busy machine (docs/stack.md,
# "OpenMP").
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import gc
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import anyio
import bentoml
from fastapi import FastAPI, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from collapse_guard.service.client.arrow_writer import ARROW_TYPE
from collapse_guard.service.client.raw_run import RawRun
from collapse_guard.service.client.wire import (
    ExplainResponse,
    ModelInfo,
    ReloadRequest,
    ReloadResponse,
    RiskRequest,
    RiskResponse,
)
from collapse_guard.service.middleware.auth import BearerAuth
from collapse_guard.service.middleware.bad_request import BadRequest, from_validation
from collapse_guard.service.middleware.body_limit import BodyLimit
from collapse_guard.service.middleware.limits import Limits
from collapse_guard.service.middleware.memory import keep_freed_memory
from collapse_guard.service.middleware.metrics import fold_unknown_paths, metrics
from collapse_guard.service.middleware.timeout import cancel_request_timers
from collapse_guard.service.server.arrow_reader import decode_runs
from collapse_guard.service.server.json_reader import read_plain_json
from collapse_guard.service.server.lifeline import end_with_parent
from collapse_guard.service.server.model_state import (
    ModelHolder,
    ModelLoadError,
    ReloadBusy,
    Serving,
    load_serving,
    scrub_paths,
)
from collapse_guard.service.server.openapi import ERROR_RESPONSES, body_of
from collapse_guard.service.server.reload_channel import (
    ChannelRefused,
    Follower,
    ReloadChannel,
    name_channel_for_workers,
)
from collapse_guard.service.server.scoring import answers_json
from collapse_guard.service.server.window_checks import check_batch_size, from_json_run
from collapse_guard.service.server.windows import WindowBatch

__all__ = ["MODEL_ENV", "POLL_ENV", "WORKERS_ENV", "RiskService", "app"]

MODEL_ENV = "COLLAPSE_GUARD_MODEL"
POLL_ENV = "COLLAPSE_GUARD_POLL"
WORKERS_ENV = "COLLAPSE_GUARD_WORKERS"
# how long a client's /reload waits for a reload this worker is already running (it follows
# another worker's, or a poll's): a load and its check take seconds, and 30 s stays well
# inside the 60-s traffic timeout
RELOAD_WAIT_SECONDS = 30.0

if bentoml.server_context.worker_index is not None:
    # a worker of `bentoml serve` (set before it imports us): circus starts each worker in
    # a session of its own, so a killed server would leave it answering (lifeline.py)
    end_with_parent()
else:
    # the process that starts the workers imports us first: name their private channel
    name_channel_for_workers()

log = logging.getLogger(__name__)

# docs routes off: BentoML serves the OpenAPI document (/docs.json) and Swagger UI (/)
app = FastAPI(title="collapse-guard risk service", docs_url=None, redoc_url=None, openapi_url=None)


# /risk and /explain read the same body (JSON or Arrow) and fail the same ways
_RUNS_BODY = {"responses": ERROR_RESPONSES, "openapi_extra": body_of(RiskRequest)}


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _top_k(raw: str | None, limits: Limits, field: str) -> int:
    try:
        value = int(raw) if raw is not None else 5
    except ValueError:
        value = -1
    if not 0 <= value <= limits.max_top_k:
        raise BadRequest(
            field, f"{raw!r}", f"a whole number 0..{limits.max_top_k}", "send e.g. top_k=5"
        )
    return value


def _parse_json(body: bytes, model: type[BaseModel]) -> BaseModel:
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as error:
        raise from_validation(error) from None


def _json_batch(
    body: bytes, limits: Limits, shape: dict[str, tuple[str, ...]]
) -> tuple[WindowBatch, int]:
    """Checked runs and top_k of a JSON body; the parsed lists die on return."""
    plain = read_plain_json(body)
    if plain is not None:
        runs, top_k = plain
    else:  # any other spelling, or something wrong: pydantic reads it and says what
        parsed = _parse_json(body, RiskRequest)
        runs = [RawRun(r.run_id, r.steps, r.signals, r.context) for r in parsed.runs]  # type: ignore[attr-defined]
        top_k = parsed.top_k  # type: ignore[attr-defined]
    check_batch_size(len(runs), limits)
    top_k = _top_k(str(top_k), limits, "top_k")
    windows = [
        from_json_run(f"runs[{i}]", run, limits=limits, **shape) for i, run in enumerate(runs)
    ]
    return WindowBatch.of(windows, shape["context_fields"]), top_k


def _freeze_long_lived() -> None:
    """Keep the collector's full passes off the objects that live as long as the worker.

    After the imports and the model there are ~265,000 of them, and a full collection
    walked them all in 300-470 ms here: one request in a few hundred stalled that long.
    Frozen objects are still freed by reference counting (a replaced model is).
    """
    gc.collect()
    gc.freeze()


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic collector off while a JSON body becomes arrays.

    Parsing makes a list per column (~1,500 for 64 windows), each allocation counting
    toward a collection that then walks every float in them: 12-15 ms of a 64-window
    request's ~90 ms of CPU here. Those lists hold no cycles and are freed by reference
    counting before the collector is back on; no await happens inside (synchronous code).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@bentoml.service(
    workers=int(os.environ.get(WORKERS_ENV) or 1),
    traffic={"timeout": 60},
    # the access log costs ~0.2 ms a request (docs/stack.md, "BentoML 1.4"); /metrics counts
    # requests anyway
    logging={"access": {"enabled": False}},
    # no spans for the scoring routes: with no exporter configured they are made and
    # dropped, ~1 ms of a small request here; remove this line to trace them
    tracing={"excluded_urls": ["/risk", "/explain", "/model"]},
)
@bentoml.asgi_app(app, path="/")
class RiskService:
    """Collapse risk for the signal windows of many training runs (collapse-guard)."""

    def __init__(self) -> None:
        self.limits = Limits.from_env()
        self.channel = ReloadChannel()
        latest = self.channel.read()
        # a worker (re)started after a reload serves what the others serve
        serving = load_serving(latest[1] if latest else os.environ.get(MODEL_ENV))
        self.metrics = metrics()
        self.metrics.serving(serving.scorer.name, serving.version)
        self.holder = ModelHolder(serving, on_swap=self._swapped)
        poll = float(os.environ.get(POLL_ENV) or 0)
        self.follower = Follower(self.holder, self.channel, poll_seconds=poll)
        self.follower.start()
        keep_freed_memory()
        _freeze_long_lived()

    def _swapped(self, new: Serving, previous: Serving) -> None:
        # a reload by the route or by the follower thread: the new model is long-lived too
        self.metrics.swapped(new, previous)
        _freeze_long_lived()

    @bentoml.on_shutdown
    def shutdown(self) -> None:
        self.follower.stop()
        # a worker stops cleanly only when its server stops (a crashed one, restarted by
        # BentoML, never gets here): no live worker needs the file after this
        self.channel.remove()

    # ------------------------------------------------- what the routes call
    async def risk(self, request: Request) -> Response:
        async def work() -> bytes:
            serving = self.holder.current  # one model for the whole answer
            batch, top_k = await self._batch(request, serving)
            answers = serving.scorer.answers(batch, top_k)
            self.metrics.scored(serving.version, [a["level"] for a in answers])
            return answers_json(answers)

        return await self._answer("/risk", work)

    async def explain(self, request: Request) -> Response:
        async def work() -> ExplainResponse:
            serving = self.holder.current
            batch, _ = await self._batch(request, serving)
            if len(batch) != 1:
                raise BadRequest(
                    "runs", f"{len(batch)} runs", "exactly one run", "explain one run a time"
                )
            return serving.scorer.explain(batch)

        return await self._answer("/explain", work)

    async def model_info(self) -> Response:
        async def work() -> ModelInfo:
            return self.holder.current.info

        return await self._answer("/model", work)

    async def reload(self, request: Request) -> Response:
        async def work() -> ReloadResponse:
            body = await request.body()
            source = _parse_json(body, ReloadRequest).source  # type: ignore[attr-defined]
            try:
                new, previous, seconds = await anyio.to_thread.run_sync(
                    self.holder.reload, source, RELOAD_WAIT_SECONDS
                )
            except (ModelLoadError, ReloadBusy) as error:
                outcome = "busy" if isinstance(error, ReloadBusy) else "failed"
                self.metrics.reloads.labels(outcome=outcome).inc()
                current = self.holder.current
                raise BadRequest(
                    "source",
                    scrub_paths(str(error)),  # a token holder learns no server path
                    "a model that loads and scores the known window correctly",
                    f"fix the source and reload again; version {current.version} keeps serving",
                    status=409,
                ) from None
            try:
                self.follower.mark_seen(self.channel.publish(new.source))
            except (ChannelRefused, OSError) as error:  # this worker did swap: say so
                log.error(
                    "reload: this worker serves %s, but the other workers were not told "
                    "(reload channel: %s); reload again once the channel is fixed",
                    new.version,
                    error,
                )
            self.metrics.reloads.labels(outcome="ok").inc()
            return ReloadResponse(
                reloaded=new.version != previous.version,
                previous_version=previous.version,
                model=new.info,
                check_probability=new.check_probability,
                seconds=seconds,
            )

        return await self._answer("/reload", work)

    # ---------------------------------------------------------------- helpers
    async def _batch(self, request: Request, serving: Serving) -> tuple[WindowBatch, int]:
        media_type = _media_type(request)
        scorer = serving.scorer
        shape = {"signals": scorer.signals, "context_fields": scorer.context_fields}
        if media_type == "application/json":
            body = await request.body()
            with _gc_paused():
                return _json_batch(body, self.limits, shape)
        if media_type == ARROW_TYPE:
            top_k = _top_k(request.query_params.get("top_k"), self.limits, "query top_k")
            return decode_runs(await request.body(), limits=self.limits, **shape), top_k
        raise BadRequest(
            "Content-Type",
            f"{media_type or 'no content type'}",
            f"application/json or {ARROW_TYPE}",
            "set the header, e.g. curl -H 'Content-Type: application/json'",
            status=415,
        )

    async def _answer(
        self, route: str, work: Callable[[], Awaitable[BaseModel | bytes]]
    ) -> Response:
        try:
            answer = await work()
            status = 200
            content = answer if isinstance(answer, bytes) else answer.model_dump_json()
        except BadRequest as error:
            status, content = error.status, json.dumps(error.body())
        self.metrics.requests.labels(route=route, status=str(status)).inc()
        return Response(content, status_code=status, media_type="application/json")


# ---------------------------------------------------------------------- routes
# Plain functions, not FastAPI class views: BentoML gives a class view its `self` through
# a synchronous dependency, which FastAPI runs in a thread pool on every request (a
# thread hand-off: ~1 ms of a one-window request's ~4 ms of CPU here, more under load).
def _service() -> RiskService:
    return bentoml.get_current_service()  # this worker's instance


@app.post(
    "/risk",
    response_model=RiskResponse,
    summary="Risk of collapse for a batch of runs (JSON or Arrow IPC stream)",
    **_RUNS_BODY,
)
async def risk(request: Request) -> Response:
    return await _service().risk(request)


@app.post(
    "/explain",
    response_model=ExplainResponse,
    summary="Every feature's contribution for one window (a /risk body with one run)",
    **_RUNS_BODY,
)
async def explain(request: Request) -> Response:
    return await _service().explain(request)


@app.get("/model", response_model=ModelInfo, responses=ERROR_RESPONSES)
async def model() -> Response:
    return await _service().model_info()


@app.post(
    "/reload",
    response_model=ReloadResponse,
    responses={
        **ERROR_RESPONSES,
        409: {**ERROR_RESPONSES[400], "description": "Not loaded; the old model serves."},
    },
    openapi_extra=body_of(ReloadRequest, arrow=False, required=False),  # none: {}
    summary="Load a model (default: the start-up source again), check it, swap it in",
)
async def reload(request: Request) -> Response:
    return await _service().reload(request)


# outermost first: an unauthenticated body is never read
RiskService.add_asgi_middleware(BearerAuth)
RiskService.add_asgi_middleware(BodyLimit)
# its per-request timers held ~5 KB each for the whole traffic timeout (middleware/timeout.py)
cancel_request_timers()
# BentoML's routes and ours: every other path is one request-metrics label, whatever it is
fold_unknown_paths(
    {"/", "/docs.json", "/livez", "/readyz", "/healthz", "/metrics"}
    | {route.path for route in app.routes}
)
