"""What ``Guard(risk=...)`` accepts, and the risk source each form makes.

=============================================  =============================================
``risk=``                                      source
=============================================  =============================================
None or ``"embedded"``                         the bundled model, in this process
``"off"``                                      none: the reactive path only
``ServiceRisk(url, token=, timeout=)``         the service, the embedded model as fallback
a URL string (``http://host:port``)            the same (``Guard``'s ``token=``/``timeout=``)
a ``RiskClient`` (or a stand-in)               the service through it, with the fallback
a ``RiskModel``                                that model, in this process
a model folder or a ``models:/`` URI           that model, loaded, in this process
=============================================  =============================================
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from collapse_guard.guard.risk_source import EmbeddedRisk, ServiceSource

if TYPE_CHECKING:
    from collapse_guard.predictor.core.risk import RiskModel
    from collapse_guard.service.client import RiskClient

__all__ = ["DEFAULT_WINDOW", "RiskSpec", "ServiceRisk", "make_risk_source", "open_risk"]

DEFAULT_WINDOW = 200  # records kept without a risk model (docs/design.md, "Features": the window)


@dataclass(frozen=True)
class ServiceRisk:
    """The risk service at ``url`` (``token``: its bearer token; ``timeout``: seconds a
    request may take in all, connect, send and the whole answer, before the window is
    scored by the embedded model instead; ``max_answer_bytes``: the longest answer read,
    None: the client's default, 8 MiB)."""

    url: str
    token: str | None = None
    timeout: float = 2.0
    max_answer_bytes: int | None = None

    def client(self) -> RiskClient:
        from collapse_guard.service.client import RiskClient  # httpx: only when used

        bound = {} if self.max_answer_bytes is None else {"max_answer_bytes": self.max_answer_bytes}
        return RiskClient(self.url, token=self.token, timeout=self.timeout, top_k=0, **bound)


RiskSpec = Union[ServiceRisk, "RiskModel", "RiskClient", str, os.PathLike, None]


def make_risk_source(risk: RiskSpec, *, run_id: str = "run") -> EmbeddedRisk | ServiceSource | None:
    """The source for ``Guard(risk=...)`` (module docstring)."""
    if risk is None or risk == "embedded":
        return EmbeddedRisk()
    if risk == "off":
        return None
    if isinstance(risk, (str, os.PathLike)) and not str(risk).startswith(("http://", "https://")):
        from collapse_guard.predictor.core.model_source import load_risk_model

        if not (Path(risk).is_dir() or str(risk).startswith(("models:/", "runs:/"))):
            raise ValueError(
                f"risk={str(risk)!r}: expected None, 'embedded', 'off', a service URL "
                "(http://host:port), a model folder, a models:/ URI, a RiskClient or a RiskModel"
            )
        return EmbeddedRisk(load_risk_model(str(risk)))
    if isinstance(risk, str):
        risk = ServiceRisk(risk)
    if isinstance(risk, ServiceRisk):
        risk = risk.client()
    if hasattr(risk, "risk") and hasattr(risk, "ready"):  # a RiskClient (or a stand-in)
        return ServiceSource(risk, EmbeddedRisk(), run_id=run_id)
    if hasattr(risk, "predict_window"):
        return EmbeddedRisk(risk)
    raise TypeError(
        f"risk must be None, 'embedded', 'off', a URL, a RiskClient or a RiskModel; "
        f"got {type(risk).__name__}"
    )


def _with_url_keywords(risk: Any, token: str | None, timeout: float | None) -> RiskSpec:
    """``Guard(risk=url, token=, timeout=)`` as ``ServiceRisk(url, token=, timeout=)``:
    the keywords, for a URL string only, are deprecated (a warning says so)."""
    if token is None and timeout is None:
        return risk
    warnings.warn(
        "Guard(token=, timeout=) is deprecated: pass risk=ServiceRisk(url, token=..., "
        "timeout=...) (from collapse_guard.guard)",
        DeprecationWarning,
        stacklevel=5,  # the loop's Guard(...) call (through build_setup, open_risk)
    )
    if isinstance(risk, str) and risk.startswith(("http://", "https://")):
        return ServiceRisk(risk, token=token, timeout=2.0 if timeout is None else timeout)
    return risk


def open_risk(
    risk: RiskSpec, *, token: str | None, timeout: float | None, run_id: str, rank: int
) -> tuple[EmbeddedRisk | ServiceSource | None, Any, int]:
    """A guard's risk source (rank 0 alone asks), its model's ``RunContext`` and the
    window it scores (None and ``DEFAULT_WINDOW`` without a risk model)."""
    risk = _with_url_keywords(risk, token, timeout)
    source = make_risk_source(risk, run_id=run_id) if rank == 0 else None
    schema = source.schema if source is not None else None
    if schema is None:
        return source, None, DEFAULT_WINDOW
    from collapse_guard.features import RunContext  # numpy only

    return source, RunContext.from_schema(schema), schema.window
