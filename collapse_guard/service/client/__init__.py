"""The client side of the risk service: what a training loop imports.

>>> from collapse_guard.service.client import RiskClient
>>> with RiskClient("http://127.0.0.1:3000") as client:
...     client.risk(frame).probability

``risk_client`` (:class:`RiskClient`), ``errors`` (what it raises), ``transport`` (its
default httpx transport), ``raw_run`` (a frame or dict of arrays as a run),
``json_writer`` and ``arrow_writer`` (the bodies it sends) and ``wire`` (the typed
requests and answers of every route, which the server validates with too). Needs httpx,
numpy, pyarrow and pydantic; never bentoml, starlette, lightgbm or any server module
(tests/service/client/test_client_imports.py): the server imports this side, never the
reverse.
"""

from __future__ import annotations

from collapse_guard.service.client.errors import (
    AnswerTooLarge,
    InvalidAnswer,
    RequestRejected,
    RiskServiceError,
    ServiceTimeout,
    ServiceUnavailable,
)
from collapse_guard.service.client.json_writer import encode_json
from collapse_guard.service.client.raw_run import as_raw_run
from collapse_guard.service.client.risk_client import RiskClient

__all__ = [
    "AnswerTooLarge",
    "InvalidAnswer",
    "RequestRejected",
    "RiskClient",
    "RiskServiceError",
    "ServiceTimeout",
    "ServiceUnavailable",
    "as_raw_run",
    "encode_json",
]
