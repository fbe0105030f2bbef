"""Where the guard's risk comes from: the embedded model, or the service with a fallback.

Both have one interface: ``submit(step, frame, context)`` hands over the window ending at
``step`` and returns at once; ``poll()`` returns the newest :class:`RiskReading` not yet
returned, or None. The guard submits every ``risk_every`` steps and polls at every step,
so an answer applies at the step after it arrives: the embedded model answers within
``submit`` (~4 ms), the service from a background thread whenever it answers.

The service never stops training (DESIGN.md): if it cannot be reached, times out,
answers an error or garbage (a probability outside [0, 1], an unknown level), or is
still busy with the previous window when the next is due, the window is scored by the
embedded model instead, a warning is given once, and the service is tried again after
a back-off (2, 4, ... 32 windows).

Each answer is one window's risk. The model's levels are set on the risk held over its
``hold_steps`` (``predictor.hold``), so the guard acts on :class:`ReadingHold`'s
answer: the highest reading of the last ``hold_steps`` steps, with its level.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import warnings
from dataclasses import dataclass, replace
from typing import Any

from collapse_guard.guard.policy import LEVELS
from collapse_guard.predictor.hold import RiskHold

__all__ = ["EmbeddedRisk", "ReadingHold", "RiskReading", "ServiceRisk", "make_risk_source"]

log = logging.getLogger(__name__)

_MAX_BACKOFF = 32  # windows skipped, at most, before the service is tried again


@dataclass(frozen=True)
class RiskReading:
    """One risk answer: the window's last step, P(collapse within the horizon), its level,
    and how long the model's levels want it held."""

    step: int
    probability: float
    level: str
    source: str  # "embedded" or "service"
    hold_steps: int = 0


class ReadingHold:
    """Readings held over their model's ``hold_steps``: each answer becomes the highest
    of the last ``hold_steps`` steps (its probability and level), as ``predict_run``
    holds a run file's risk. A reading from a model with another hold (the service
    fell back, or reloaded) starts the hold afresh."""

    def __init__(self) -> None:
        self._hold = RiskHold(0)

    def __call__(self, reading: RiskReading) -> RiskReading:
        if reading.hold_steps != self._hold.steps:
            self._hold = RiskHold(reading.hold_steps)
        p, level = self._hold.update(reading.step, reading.probability, reading.level)
        return replace(reading, probability=p, level=level)

    def state_dict(self) -> dict[str, Any]:
        return self._hold.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._hold = RiskHold(0).load_state_dict(state)


class EmbeddedRisk:
    """The risk model in this process (default: the bundled one, ``RiskModel.load()``)."""

    source = "embedded"

    def __init__(self, model: Any = None) -> None:
        if model is None:
            from collapse_guard.predictor import RiskModel  # lightgbm: only when used

            model = RiskModel.load()
        self.model = model
        self.schema = model.schema
        # a stand-in model without a hold of its own (levels on raw risk) holds nothing
        self.hold_steps = int(getattr(model, "hold_steps", 0))
        self._lock = threading.Lock()  # the service worker may score here too
        self._latest: RiskReading | None = None

    def score(self, step: int, frame: Any, context: dict[str, float] | None) -> RiskReading:
        with self._lock:
            p = self.model.predict_window(frame, context=context)
            level = self.model.level(p)
            return RiskReading(step, p, level, self.source, self.hold_steps)

    def submit(self, step: int, frame: Any, context: dict[str, float] | None) -> None:
        self._latest = self.score(step, frame, context)

    def poll(self) -> RiskReading | None:
        reading, self._latest = self._latest, None
        return reading

    def close(self) -> None:
        pass


class ServiceRisk:
    """The risk service through a :class:`RiskClient`, asked from a background thread."""

    source = "service"

    def __init__(self, client: Any, fallback: EmbeddedRisk, run_id: str = "run") -> None:
        self.client, self.fallback, self.run_id = client, fallback, run_id
        self.schema = fallback.schema
        self.warned = False
        self.failures = 0
        self._backoff = 0  # windows still to score locally before trying the service again
        self._busy = False  # a request is in flight
        self._requests: queue.Queue = queue.Queue(maxsize=1)
        self._answers: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="collapse-guard-risk", daemon=True)
        self._thread.start()

    def _warn(self, why: str) -> None:
        self.failures += 1
        self._backoff = min(_MAX_BACKOFF, 2**self.failures)
        if not self.warned:
            self.warned = True
            warnings.warn(
                f"collapse-guard: the risk service failed ({why}); scoring with the embedded "
                "model and training on. The service is retried with back-off; this warning "
                "is given once.",
                RuntimeWarning,
                stacklevel=3,
            )
        log.info("risk service failed: %s", why)

    def submit(self, step: int, frame: Any, context: dict[str, float] | None) -> None:
        if self._backoff > 0 or self._busy:
            if self._busy:
                self._warn("still busy with the previous window: too slow")
            else:
                self._backoff -= 1
            self._answers.put(self.fallback.score(step, frame, context))
            return
        self._busy = True
        self._requests.put((step, frame, context))

    def poll(self) -> RiskReading | None:
        newest = None
        while True:
            try:
                item = self._answers.get_nowait()
            except queue.Empty:
                return newest
            if isinstance(item, RiskReading):
                newest = item
            else:  # (error text, step, frame, context) from the worker
                why, step, frame, context = item
                self._warn(why)
                newest = self.fallback.score(step, frame, context)

    def _work(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            step, frame, context = request
            try:
                result = self.client.risk(frame, run_id=self.run_id, context=context)
                p, level = float(result.probability), str(result.level)
                if not (math.isfinite(p) and 0.0 <= p <= 1.0) or level not in LEVELS:
                    raise ValueError(f"garbage answer: probability {p!r}, level {level!r}")
                answer: Any = RiskReading(step, p, level, self.source, result.hold_steps)
            except Exception as error:  # any failure of the service falls back
                answer = (f"{type(error).__name__}: {error}", step, frame, context)
            self._busy = False
            self._answers.put(answer)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._requests.put_nowait(None)
            except queue.Full:  # a request is pending: the daemon thread ends with the process
                pass
            self._thread.join(timeout=1.0)


def make_risk_source(
    risk: Any, *, token: str | None = None, timeout: float = 2.0, run_id: str = "run"
) -> EmbeddedRisk | ServiceRisk | None:
    """The source for ``Guard(risk=...)``: None or "embedded" -> the bundled model; "off"
    -> no risk (reactive path only); a URL or a ``RiskClient`` -> the service with the
    embedded fallback; a ``RiskModel`` -> that model embedded."""
    if risk is None or risk == "embedded":
        return EmbeddedRisk()
    if risk == "off":
        return None
    if isinstance(risk, str):
        if not risk.startswith(("http://", "https://")):
            raise ValueError(
                f"risk={risk!r}: expected None, 'embedded', 'off', a service URL "
                "(http://host:port), a RiskClient or a RiskModel"
            )
        from collapse_guard.service.client import RiskClient  # httpx: only when used

        risk = RiskClient(risk, token=token, timeout=timeout, top_k=0)
    if hasattr(risk, "risk") and hasattr(risk, "ready"):  # a RiskClient (or a stand-in)
        return ServiceRisk(risk, EmbeddedRisk(), run_id=run_id)
    if hasattr(risk, "predict_window"):
        return EmbeddedRisk(risk)
    raise TypeError(
        f"risk must be None, 'embedded', 'off', a URL, a RiskClient or a RiskModel; "
        f"got {type(risk).__name__}"
    )
