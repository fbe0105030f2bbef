"""The risk service and its client (docs/design.md, "Service"), split by who runs it.

>>> from collapse_guard.service import RiskClient
>>> client = RiskClient("http://127.0.0.1:3000")
>>> client.risk(frame).probability

``client/``: what a training loop imports (the client, its errors and transport, the wire
format); ``server/``: the BentoML service, its readers, scoring and model state;
``middleware/``: the server's HTTP middleware (token, body and request limits, metrics).
The server imports the other two, the middleware the client side, the client side
neither. The modules beside these packages are the old paths, kept for one release.

Serve with ``collapse-guard serve`` or ``bentoml serve
collapse_guard.service.server.risk_service:RiskService``. Names are imported on first
use (PEP 562): ``import collapse_guard.service`` imports neither bentoml nor lightgbm nor
torch, and the client needs only httpx, numpy, pyarrow and pydantic.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "AnswerTooLarge",
    "InvalidAnswer",
    "RequestRejected",
    "RiskClient",
    "RiskServiceError",
    "ServiceTimeout",
    "ServiceUnavailable",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.client"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
