"""The risk service and its client (DESIGN.md "Service").

>>> from collapse_guard.service import RiskClient
>>> client = RiskClient("http://127.0.0.1:3000")
>>> client.risk(frame).probability

Serve with ``collapse-guard serve`` or ``bentoml serve
collapse_guard.service.service:RiskService``. Names are imported on first use (PEP 562):
``import collapse_guard.service`` imports neither bentoml nor lightgbm nor torch, and the
client needs only httpx, numpy, pyarrow and pydantic.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
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
