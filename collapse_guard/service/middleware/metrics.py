"""The service's own Prometheus metrics, served beside BentoML's at ``/metrics``.

=======================================  =======  ===========================================
name                                     type     labels
=======================================  =======  ===========================================
``collapse_guard_requests_total``        counter  route, status (HTTP code)
``collapse_guard_windows_total``         counter  level, model_version: windows scored
``collapse_guard_model_info``            gauge    model_name, model_version, worker: 1 = serving
``collapse_guard_reloads_total``         counter  outcome (``ok``, ``failed``, ``busy``)
=======================================  =======  ===========================================

BentoML 1.4 deprecates ``bentoml.metrics`` for ``prometheus_client`` itself, imported
only once the worker has set ``PROMETHEUS_MULTIPROC_DIR`` (so from the service's
``__init__``, never at module import): then every worker's values reach ``/metrics``.
The metrics are made once per process (a second registration would be an error).
A worker is named by its index (1..N), never its process id.

BentoML's own request metrics (``bentoml_service_request_*``) are labelled with the raw
request path, before any route or token is checked: 4,000 requests to made-up paths,
all 401, took one worker from 389 to 505 MB and ``/metrics`` from 176 KB to 33 MB.
:func:`fold_unknown_paths` makes that label one of the service's paths or
:data:`OTHER_PATH`, and BentoML's last-request gauge the workers' latest rather than one
series per worker pid (BentoML has no setting for either: its middleware is wrapped).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from collapse_guard.predictor.core.levels import Level

__all__ = ["OTHER_PATH", "Metrics", "fold_unknown_paths", "metrics"]

OTHER_PATH = "/{other}"  # the request-metrics label of every path the service does not serve
_REAL_PATH = "collapse_guard.real_path"  # the scope key the path waits in meanwhile


@dataclass(frozen=True)
class Metrics:
    requests: Any
    windows: Any
    model_info: Any
    reloads: Any

    def scored(self, version: str, levels: list[Level]) -> None:
        counts: dict[str, int] = {}
        for level in levels:
            counts[level] = counts.get(level, 0) + 1
        for level, n in counts.items():
            self.windows.labels(level=level, model_version=version).inc(n)

    def serving(self, name: str, version: str) -> None:
        self._model(name, version).set(1)

    def swapped(self, new: Any, previous: Any) -> None:
        """A worker swapped models (``Serving`` objects): move its gauge."""
        if (previous.scorer.name, previous.version) != (new.scorer.name, new.version):
            self._model(previous.scorer.name, previous.version).set(0)
        self.serving(new.scorer.name, new.version)

    def _model(self, name: str, version: str) -> Any:
        return self.model_info.labels(model_name=name, model_version=version, worker=_worker())


def _worker() -> str:
    import bentoml

    return str(bentoml.server_context.worker_index or 0)  # 0: not in a served worker


@functools.cache
def metrics() -> Metrics:
    """This process's metrics (made on first call)."""
    from prometheus_client import Counter, Gauge

    return Metrics(
        requests=Counter(
            "collapse_guard_requests_total",
            "Requests answered by the risk service's routes.",
            ["route", "status"],
        ),
        windows=Counter(
            "collapse_guard_windows_total",
            "Windows scored, by level and by the model version that scored them.",
            ["level", "model_version"],
        ),
        # one series per worker (its index), so that an operator, or a test, sees which
        # version each worker serves during a reload; live: a dead worker's are dropped
        model_info=Gauge(
            "collapse_guard_model_info",
            "1 for the model version a worker serves.",
            ["model_name", "model_version", "worker"],
            multiprocess_mode="livemax",
        ),
        reloads=Counter("collapse_guard_reloads_total", "Model reloads by outcome.", ["outcome"]),
    )


def fold_unknown_paths(paths: Collection[str]) -> None:
    """Label BentoML's request metrics with ``paths`` or :data:`OTHER_PATH` only, and
    its last-request time without worker pids.

    BentoML's traffic middleware reads ``scope["path"]`` for its label; it is replaced by
    a subclass that hands it a folded path and hands the app below it the real one.
    Call before BentoML builds the app (at import of the service module); idempotent.
    """
    from bentoml._internal.server.http import instruments

    base = instruments.RunnerTrafficMetricsMiddleware
    if getattr(base, "folds_paths", False):
        return
    known = frozenset(paths)

    class FoldedPaths(base):  # type: ignore[misc, valid-type]
        folds_paths = True

        def __init__(self, app: ASGIApp, **options: Any) -> None:
            super().__init__(_RealPath(app), **options)

        def _setup(self) -> None:
            super()._setup()
            # its last-request gauge keeps one series per process, labelled with the pid:
            # the same gauge as the latest of the workers' instead (no pid shown)
            old = self.metrics_last_request_timestamp
            self.metrics_client.registry.unregister(old)
            self.metrics_last_request_timestamp = self.metrics_client.Gauge(
                name=old._name,
                documentation=old._documentation,
                labelnames=old._labelnames,
                multiprocess_mode="max",
            )

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            path = scope.get("path")
            if path is not None and path not in known:
                scope = {**scope, "path": OTHER_PATH, _REAL_PATH: path}
            await super().__call__(scope, receive, send)

    instruments.RunnerTrafficMetricsMiddleware = FoldedPaths


class _RealPath:
    """Gives the app below BentoML's traffic middleware the path the client sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        real = scope.get(_REAL_PATH)
        if real is not None:
            scope = {k: v for k, v in scope.items() if k != _REAL_PATH} | {"path": real}
        await self.app(scope, receive, send)
