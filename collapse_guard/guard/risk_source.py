"""Where the guard's risk comes from: the embedded model, or the service with a fallback.

Both have one interface: ``submit(step, frame, context)`` hands over the window ending at
``step`` and returns at once; ``poll()`` returns the newest :class:`RiskReading` not yet
returned, or None. The guard submits every ``risk_every`` steps and polls at every step,
so an answer applies at the step after it arrives: the embedded model answers within
``submit`` (~4 ms), the service from a background thread whenever it answers.

The service never stops training (docs/design.md, "Guard"): if it cannot be reached, times out,
answers an error or garbage, or is still busy with the previous window when the next is
due, the window is scored by the fallback model instead, a warning is given once, and the
service is tried again after a back-off (2, 4, ... 32 windows).

The fallback is the model named with the guard (``ServiceRisk(url, fallback=FOLDER)``),
else the bundled one. No route of the service hands out a model's files (``/model`` names
a folder by its last name only), so the guard cannot fetch the served model itself: the
warning names the version it scores with and the served one, and says so loudly when they
differ (their levels then differ too: a calibrated model's ``warn`` is not the bundled
model's). Every reading carries the version that scored it. Everything read from the
network is untrusted. The client reads an answer strictly and within its size and time
bounds (service/client/risk_client.py: ``true`` or ``"0.5"`` is no probability, a 300 MB
or trickling answer is cut off), and :func:`read_answer` checks again whatever a client
or a stand-in hands over, never coercing: a probability that is not a number (a boolean
or a string is none) in [0, 1], a level that is not one of ``RISK_LEVELS``, a
``hold_steps`` that is not a whole number in [0, ``MAX_HOLD_STEPS``] make the whole answer
garbage.

The probability is the answer; its level is checked against it. The guard acts on the
level the answering model's thresholds give the probability (from the service's
``/model``, read once per model version; the embedded model's where that cannot be read),
and says once when the service's own level disagrees (``p=0.01, level="critical"``).

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

from collapse_guard.predictor.core.hold import MAX_HOLD_STEPS, RiskHold
from collapse_guard.predictor.core.levels import RISK_LEVELS, Level, thresholds_or_none
from collapse_guard.predictor.core.version import content_version

__all__ = [
    "MAX_HOLD_STEPS",
    "EmbeddedRisk",
    "GarbageAnswer",
    "ReadingHold",
    "RiskReading",
    "ServiceSource",
    "model_version",
    "read_answer",
]

log = logging.getLogger(__name__)

_MAX_BACKOFF = 32  # windows skipped, at most, before the service is tried again
_NAME_IT = (
    "; to keep the served model and its levels, name it with the guard: "
    "ServiceRisk(url, fallback=MODEL_FOLDER)"
)


class GarbageAnswer(ValueError):
    """A service answer that is well-formed JSON but not a risk (module docstring)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_answer(result: Any) -> tuple[float, Level, int]:
    """``(probability, level, hold_steps)`` of a service answer, or :class:`GarbageAnswer`."""
    p = getattr(result, "probability", None)
    level = getattr(result, "level", None)
    hold = getattr(result, "hold_steps", None)
    if not (_is_number(p) and math.isfinite(p) and 0.0 <= p <= 1.0):
        raise GarbageAnswer(f"garbage answer: probability {p!r} is not a number in [0, 1]")
    if not isinstance(level, str) or level not in RISK_LEVELS:
        names = tuple(known.value for known in RISK_LEVELS)
        raise GarbageAnswer(f"garbage answer: level {level!r} is not one of {names}")
    if not (isinstance(hold, int) and not isinstance(hold, bool)) or not (
        0 <= hold <= MAX_HOLD_STEPS
    ):
        raise GarbageAnswer(
            f"garbage answer: hold_steps {hold!r} is not a whole number in [0, {MAX_HOLD_STEPS}]"
        )
    return float(p), Level.parse(level), hold


def model_version(model: Any) -> str | None:
    """The version the service names ``model`` by (``predictor.core.version``); None for a
    stand-in without a version."""
    meta = getattr(model, "meta", None)
    if not isinstance(meta, dict) or "version" not in meta:
        return None
    # a registry load stamps the version's run id and its models:/ source (predictor.core.store)
    numbered = "run_id" in meta and str(meta.get("source", "")).startswith("models:/")
    return content_version(model, numbered)


@dataclass(frozen=True)
class RiskReading:
    """One risk answer: the window's last step, P(collapse within the horizon), its level,
    how long the model's levels want it held, and the version of the model that scored it."""

    step: int
    probability: float
    level: Level  # a level's name is parsed here, where a reading enters the guard
    source: str  # "embedded", "service" or "fallback" (the service failed)
    hold_steps: int = 0
    model_version: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", Level.parse(self.level))


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
        # the hold keeps the level's name: its state is plain values (a checkpoint's)
        p, level = self._hold.update(reading.step, reading.probability, reading.level.value)
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
            from collapse_guard.predictor.core.risk import RiskModel  # lightgbm: only when used

            model = RiskModel.load()
        self.model = model
        self.schema = model.schema
        # a stand-in model without a hold of its own (levels on raw risk) holds nothing
        self.hold_steps = int(getattr(model, "hold_steps", 0))
        self._lock = threading.Lock()  # the service worker may score here too
        self._latest: RiskReading | None = None
        self._version: tuple[Any, str | None] = (None, None)  # (model, its version)

    @property
    def version(self) -> str | None:
        """:func:`model_version` of the model, kept while the model is the same object
        (a fingerprint hashes every tree)."""
        if self._version[0] is not self.model:
            self._version = (self.model, model_version(self.model))
        return self._version[1]

    def score(self, step: int, frame: Any, context: dict[str, float] | None) -> RiskReading:
        from collapse_guard.features.ring import SignalWindow, window_risk

        with self._lock:
            if isinstance(frame, SignalWindow):  # the guard's ring: the extractor's array path
                p = window_risk(self.model, frame, context)
            else:
                p = self.model.predict_window(frame, context=context)
            level = self.model.level(p)
            return RiskReading(step, p, level, self.source, self.hold_steps, self.version)

    def submit(self, step: int, frame: Any, context: dict[str, float] | None) -> None:
        self._latest = self.score(step, frame, context)

    def poll(self) -> RiskReading | None:
        reading, self._latest = self._latest, None
        return reading

    def close(self) -> None:
        pass


class ServiceSource:
    """The risk service through a :class:`RiskClient`, asked from a background thread;
    ``fallback`` scores when it fails (``named``: the user named that model)."""

    source = "service"

    def __init__(
        self, client: Any, fallback: EmbeddedRisk, run_id: str = "run", named: bool = False
    ) -> None:
        self.client, self.fallback, self.run_id, self.named = client, fallback, run_id, named
        self.schema = fallback.schema
        self.warned = False
        self.disagreements = 0  # answers whose level was not their probability's
        self._note: str | None = None  # a warning for the training thread to give
        # model version -> its thresholds from the service's /model (None: not read)
        self._levels: dict[Any, dict[str, float] | None] = {}
        self.served: str | None = None  # the version of the service's last good answer
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
                f"collapse-guard: the risk service failed ({why}); scoring with "
                f"{self._instead()} and training on. The service is retried with back-off; "
                "this warning is given once.",
                RuntimeWarning,
                stacklevel=3,
            )
        log.info("risk service failed: %s", why)

    def _instead(self) -> str:
        """The model the fallback scores with, against the one the service was serving."""
        used, served = self.fallback.version, self.served
        which = "the model named with the guard" if self.named else "the bundled model"
        if served is not None and served == used:
            return f"{which}, version {used!r}, the model the service was serving"
        if served is None:
            text = f"{which}, version {used!r} (the service never answered, so its model is unknown"
            return text + (")" if self.named else f"{_NAME_IT})")
        return (
            f"{which}, version {used!r}, NOT the served model {served!r}: "
            f"{self._levels_against(served)}{_NAME_IT}"
        )

    def _levels_against(self, served: str) -> str:
        ours = thresholds_or_none(getattr(self.fallback.model, "thresholds", None))
        theirs = self._levels.get(served)
        if ours is None or theirs is None:
            return "its levels may differ (the served model's were not read from /model)"
        if ours == theirs:
            return "another model with the same levels"
        return (
            f"its levels differ (warn at p >= {ours['warn']:.3g}, the served model's at "
            f"{theirs['warn']:.3g})"
        )

    def _score_here(self, step: int, frame: Any, context: dict[str, float] | None) -> RiskReading:
        return replace(self.fallback.score(step, frame, context), source="fallback")

    def submit(self, step: int, frame: Any, context: dict[str, float] | None) -> None:
        if self._backoff > 0 or self._busy:
            if self._busy:
                self._warn("still busy with the previous window: too slow")
            else:
                self._backoff -= 1
            self._answers.put(self._score_here(step, frame, context))
            return
        self._busy = True
        self._requests.put((step, frame, context))

    def poll(self) -> RiskReading | None:
        note, self._note = self._note, None
        if note:
            warnings.warn(note, RuntimeWarning, stacklevel=3)
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
                newest = self._score_here(step, frame, context)

    def _work(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            step, frame, context = request
            try:
                result = self.client.risk(frame, run_id=self.run_id, context=context)
                p, level, hold = read_answer(result)
                version = getattr(result, "model_version", None)
                version = version if isinstance(version, str) else None
                level = self._checked_level(p, level, version, getattr(result, "reason", None))
                answer: Any = RiskReading(step, p, level, self.source, hold, version)
                self.served = version
            except Exception as error:  # any failure of the service falls back
                answer = (f"{type(error).__name__}: {error}", step, frame, context)
            self._busy = False
            self._answers.put(answer)

    def _thresholds_of(self, version: Any) -> dict[str, float] | None:
        """The answering model's thresholds: the service's /model when it serves that
        version, else the fallback model's (None: neither is known)."""
        if version not in self._levels:
            found = None
            try:
                info = self.client.model_info()
                if getattr(info, "version", None) == version:
                    found = thresholds_or_none(getattr(info, "thresholds", None))
            except Exception:  # no /model (a stand-in, an older service): the fallback's levels
                found = None
            self._levels[version] = found
        return self._levels[version] or thresholds_or_none(
            getattr(self.fallback.model, "thresholds", None)
        )

    def _checked_level(self, p: float, level: Level, version: Any, reason: Any = None) -> Level:
        from collapse_guard.predictor.core.levels import level_of  # numpy only

        thresholds = self._thresholds_of(version)
        if thresholds is None:
            return level
        own = level_of(p, thresholds)
        # a reason is the service's reactive reading (a measured non-finite loss now): the
        # guard's own reactive path has acted on that loss already, so the forecast's level
        # is the one to act on, and the two differing is no disagreement to warn about
        if own != level and not reason:
            self.disagreements += 1
            if self.disagreements == 1:  # warned from poll(): the training thread's warning
                self._note = (
                    f"collapse-guard: the risk service answered level {level.value!r} for "
                    f"probability {p:.3g}, which its model's thresholds call {own.value!r}; the "
                    "guard acts on the probability's level. This warning is given once."
                )
        return own

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:  # a request still waiting is not asked any more: the thread ends after
                self._requests.get_nowait()  # the one in flight, not after one more
            except queue.Empty:
                pass
            self._requests.put_nowait(None)  # the only producer is this (training) thread
            self._thread.join(timeout=1.0)
