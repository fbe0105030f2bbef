"""What ``Guard(risk=...)`` accepts, and the risk source each form makes.

=============================================  =============================================
``risk=``                                      source
=============================================  =============================================
None or ``"embedded"``                         the bundled model, in this process
``"off"``                                      none: the reactive path only
``ServiceRisk(url, token=, timeout=,           the service; ``fallback`` (a model folder, a
fallback=)``                                   ``models:/`` URI or a ``RiskModel``) scores
                                               when it fails, default the bundled model
a URL string (``http://host:port``)            the service, the bundled model as fallback
a ``RiskClient`` (or a stand-in)               the same, through that client
a ``RiskModel``                                that model, in this process
a model folder or a ``models:/`` URI           that model, loaded, in this process
=============================================  =============================================

A fallback is named with the guard, not fetched: the service hands out no model files
(risk_source.py says what the warning says when the two models differ).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from collapse_guard.errors import UserInputError
from collapse_guard.guard.risk_source import EmbeddedRisk, ServiceSource

if TYPE_CHECKING:
    from collapse_guard.predictor.core.risk import RiskModel
    from collapse_guard.service.client import RiskClient

__all__ = ["DEFAULT_WINDOW", "RiskSpec", "ServiceRisk", "make_risk_source", "open_risk"]

DEFAULT_WINDOW = 200  # records kept without a risk model (docs/design.md, "Features": the window)
_FORMS = (
    "risk= takes None or 'embedded' (the bundled model), 'off', a service URL "
    "(http://host:port) or ServiceRisk(url, fallback=MODEL_FOLDER), a model folder "
    "(RiskModel.save), a models:/ or runs:/ URI "
    "(models:/collapse-predictor@champion), a RiskClient or a RiskModel"
)


@dataclass(frozen=True)
class ServiceRisk:
    """The risk service at ``url`` (``token``: its bearer token; ``timeout``: seconds a
    request may take in all, connect, send and the whole answer, before the window is
    scored by the fallback model instead; ``max_answer_bytes``: the longest answer read,
    None: the client's default, 8 MiB; ``fallback``: the model that scores while the
    service fails, a model folder, a ``models:/`` URI or a ``RiskModel``, best the one the
    service serves; None: the bundled model)."""

    url: str
    token: str | None = None
    timeout: float = 2.0
    max_answer_bytes: int | None = None
    fallback: str | os.PathLike | RiskModel | None = None

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
        return EmbeddedRisk(_load_model(str(risk), "risk"))
    if isinstance(risk, str):
        risk = ServiceRisk(risk)
    fallback = None
    if isinstance(risk, ServiceRisk):
        fallback, risk = risk.fallback, risk.client()
    if hasattr(risk, "risk") and hasattr(risk, "ready"):  # a RiskClient (or a stand-in)
        model = _fallback_model(fallback)
        return ServiceSource(risk, EmbeddedRisk(model), run_id=run_id, named=model is not None)
    if hasattr(risk, "predict_window"):
        return EmbeddedRisk(risk)
    raise TypeError(f"risk={type(risk).__name__}: not a risk source; {_FORMS}")


def _fallback_model(fallback: Any) -> Any:
    """``ServiceRisk``'s ``fallback`` as a model (None: the bundled one)."""
    if fallback is None or hasattr(fallback, "predict_window"):
        return fallback
    if isinstance(fallback, (str, os.PathLike)):
        return _load_model(str(fallback), "ServiceRisk(fallback=...)")
    raise TypeError(
        f"ServiceRisk(fallback={type(fallback).__name__}): expected a model folder, a "
        "models:/ URI or a RiskModel (best the model the service serves), or None for the "
        "bundled model"
    )


def _load_model(text: str, argument: str) -> RiskModel:
    """The model a folder or registry URI names; errors name ``argument`` (a Python
    argument: the loader's own words are for the command line's ``--model``)."""
    from collapse_guard.predictor.core.model_source import load_risk_model
    from collapse_guard.predictor.core.store import is_registry_uri

    if not (is_registry_uri(text) or Path(text).exists()):
        raise UserInputError(
            f"{argument}={text!r}: no such model folder, {Path(text).absolute()} does not exist",
            _FORMS,
        )
    try:
        return load_risk_model(text)
    except UserInputError as error:
        what = error.message.removeprefix(f"--model {text}: ")
        hint = error.hint if error.hint and "--model" not in error.hint else _FORMS
        raise UserInputError(f"{argument}={text!r}: {what}", hint) from error.__cause__


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
