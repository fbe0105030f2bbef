"""The service's own Prometheus metrics, served beside BentoML's at ``/metrics``.

=======================================  =======  ===========================================
name                                     type     labels
=======================================  =======  ===========================================
``collapse_guard_requests_total``        counter  route, status (HTTP code)
``collapse_guard_windows_total``         counter  level, model_version: windows scored
``collapse_guard_model_info``            gauge    model_name, model_version, pid: 1 = serving
``collapse_guard_reloads_total``         counter  outcome (``ok``, ``failed``, ``busy``)
=======================================  =======  ===========================================

BentoML 1.4 deprecates ``bentoml.metrics`` for ``prometheus_client`` itself, imported
only once the worker has set ``PROMETHEUS_MULTIPROC_DIR`` (so from the service's
``__init__``, never at module import): then every worker's values reach ``/metrics``.
The metrics are made once per process (a second registration would be an error).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["Metrics", "metrics"]


@dataclass(frozen=True)
class Metrics:
    requests: Any
    windows: Any
    model_info: Any
    reloads: Any

    def scored(self, version: str, levels: list[str]) -> None:
        counts: dict[str, int] = {}
        for level in levels:
            counts[level] = counts.get(level, 0) + 1
        for level, n in counts.items():
            self.windows.labels(level=level, model_version=version).inc(n)

    def serving(self, name: str, version: str) -> None:
        self.model_info.labels(model_name=name, model_version=version).set(1)

    def swapped(self, new: Any, previous: Any) -> None:
        """A worker swapped models (``Serving`` objects): move its gauge."""
        if (previous.scorer.name, previous.version) != (new.scorer.name, new.version):
            self.model_info.labels(
                model_name=previous.scorer.name, model_version=previous.version
            ).set(0)
        self.serving(new.scorer.name, new.version)


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
        # liveall: one series per live worker (label pid), so that an operator, or a
        # test, sees which version each worker serves during a reload
        model_info=Gauge(
            "collapse_guard_model_info",
            "1 for the model version a worker serves.",
            ["model_name", "model_version"],
            multiprocess_mode="liveall",
        ),
        reloads=Counter("collapse_guard_reloads_total", "Model reloads by outcome.", ["outcome"]),
    )
