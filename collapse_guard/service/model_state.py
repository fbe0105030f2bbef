"""The serving model: load it, prove it answers correctly, swap it in without downtime.

A request takes :attr:`ModelHolder.current` once and uses that snapshot to the end, so
every answer is produced by, and names, exactly one model version, also while a reload
swaps the reference (one attribute assignment: atomic in CPython).

Before a new model serves, it scores a known window (:func:`known_window`, fixed
numbers) through the service's own path and through ``RiskModel.predict_window``; the
two must agree to the bit and give a finite probability in [0, 1]. That catches a model
whose feature schema or calibration this code cannot run, before any caller sees it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from collapse_guard.features import DEFAULT_WINDOW
from collapse_guard.predictor.levels import LEVELS
from collapse_guard.service.runs import RunWindow, WindowBatch
from collapse_guard.service.scoring import Scorer
from collapse_guard.service.wire import ModelInfo, SchemaInfo

__all__ = [
    "DEFAULT_SOURCE",
    "ModelHolder",
    "ModelLoadError",
    "ReloadBusy",
    "Serving",
    "alias_of",
    "known_window",
    "load_serving",
]

DEFAULT_SOURCE = "default"  # the model bundled in the package
# meta entries that are bookkeeping, not evaluation figures or settings worth showing
_HIDDEN_META = {"split"}


class ModelLoadError(Exception):
    """A model could not be loaded or failed its check; the old one keeps serving."""


class ReloadBusy(Exception):
    """Another reload is in progress in this worker."""


@dataclass(frozen=True)
class Serving:
    """A loaded, checked model and how it was found."""

    scorer: Scorer
    source: str
    alias: str | None
    info: ModelInfo
    check_probability: float

    @property
    def version(self) -> str:
        return self.scorer.version


def alias_of(source: str) -> str | None:
    """``models:/collapse-predictor@champion`` -> ``champion``; None for anything else."""
    if source.startswith("models:/") and "@" in source:
        return source.rsplit("@", 1)[1]
    return None


def known_window(signals: Sequence[str], steps: int = DEFAULT_WINDOW) -> RunWindow:
    """A fixed, healthy-looking window of every signal: the same numbers in every process."""
    t = np.arange(steps, dtype=np.float64)
    # a smooth, slightly different curve per signal: no randomness
    columns = {
        name: 1.0 + 0.1 * np.sin(t / (7.0 + k)) + 0.001 * t for k, name in enumerate(signals)
    }
    if "loss" in columns:
        columns["loss"] = 2.6 - 0.001 * t  # a loss that slowly falls: a healthy run
    return RunWindow("known-window", np.arange(steps, dtype=np.int64), columns)


def _check(scorer: Scorer) -> float:
    window = known_window(scorer.signals)
    batch = WindowBatch.of([window], scorer.context_fields)
    served = scorer.answers(batch, top_k=1)[0]["probability"]
    embedded = scorer.model.predict_window(window.frame(), context=dict(window.context))
    if not (math.isfinite(served) and 0.0 <= served <= 1.0):
        raise ModelLoadError(f"it scores the known window {served!r}, not a probability in [0, 1]")
    if served != embedded:
        raise ModelLoadError(
            f"the service path scores the known window {served!r} but the model itself "
            f"{embedded!r}; its feature schema does not match this code"
        )
    return served


def _info(scorer: Scorer, source: str, alias: str | None) -> ModelInfo:
    model, meta = scorer.model, scorer.model.meta
    schema = model.schema
    figures = {
        k: float(v)
        for k, v in meta.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }
    return ModelInfo(
        name=scorer.name,
        version=scorer.version,
        alias=alias,
        source=source,
        horizon=model.horizon,
        hold_steps=model.hold_steps,
        feature_schema=SchemaInfo(
            version=schema.version,
            window=schema.window,
            signals=list(schema.signals),
            context=list(scorer.context_fields),
            fingerprint=schema.fingerprint,
            names=list(schema.names),
        ),
        levels=["ok", *LEVELS],
        thresholds=model.thresholds,
        budgets={k: float(v) for k, v in model.budgets.items()},
        trained_at=meta.get("trained_at"),
        evaluation=figures,
        meta={k: v for k, v in meta.items() if k not in _HIDDEN_META},
    )


def load_serving(source: str | None) -> Serving:
    """Load ``source`` ('default', a folder, a models:/ or runs:/ URI) and check it.

    Any failure (missing folder, unknown alias, unreadable file, failed check) is a
    :class:`ModelLoadError` whose message says what and why.
    """
    source = source or DEFAULT_SOURCE
    try:
        from collapse_guard.predictor.risk import RiskModel  # lightgbm: loaded here

        model = RiskModel.load(None if source == DEFAULT_SOURCE else source)
        scorer = Scorer(model, str(model.meta["name"]), str(model.meta["version"]))
        probability = _check(scorer)
    except ModelLoadError as error:
        raise ModelLoadError(f"model {source!r} failed its check: {error}") from None
    except Exception as error:  # any failure must leave the old model serving
        raise ModelLoadError(f"cannot load model {source!r}: {error}") from None
    alias = alias_of(source)
    return Serving(scorer, source, alias, _info(scorer, source, alias), probability)


class ModelHolder:
    """The serving model of one worker and its reload lock."""

    def __init__(
        self, serving: Serving, on_swap: Callable[[Serving, Serving], None] | None = None
    ) -> None:
        self.current = serving
        self.on_swap = on_swap  # (new, previous): e.g. the model-info gauge
        self._lock = threading.Lock()

    def reload(self, source: str | None) -> tuple[Serving, Serving, float]:
        """Load and check ``source`` (default: the current source), then swap it in.

        Returns (new, previous, seconds). Raises :class:`ReloadBusy` when a reload is
        already running here, :class:`ModelLoadError` when the new model is unusable:
        in both cases the current model keeps serving.
        """
        if not self._lock.acquire(blocking=False):
            raise ReloadBusy("a reload is already in progress in this worker")
        try:
            started = time.perf_counter()
            previous = self.current
            new = load_serving(source or previous.source)
            self.current = new
            if self.on_swap is not None:
                self.on_swap(new, previous)
            return new, previous, time.perf_counter() - started
        finally:
            self._lock.release()
