"""The serving model: load it, prove it answers correctly, swap it in without downtime.

A request takes :attr:`ModelHolder.current` once and uses that snapshot to the end, so
every answer is produced by, and names, exactly one model version, also while a reload
swaps the reference (one attribute assignment: atomic in CPython).

Before a new model serves, it scores a known window (:func:`known_window`, fixed
numbers) through the service's own path and through ``RiskModel.predict_window``; the
two must agree to the bit and give a finite probability in [0, 1]. That catches a model
whose feature schema or calibration this code cannot run, before any caller sees it. Its
files are read by ``RiskModel.load_folder`` (predictor.core.model_file, the one loader):
``model.txt`` proven whole and loaded by a child process first, so a file that crashes
LightGBM is a :class:`ModelLoadError`, never the worker's death; tampered levels or hold
are one too.

A served version names the model's content, not only its label: a folder's label
(``meta["version"]``) gets ``+`` and 8 hex digits of ``RiskModel.fingerprint()`` (trees,
calibration, levels, hold) unless the label already ends with them (the bundled model's
does); so a model edited under the same label answers under another version. A registry
version keeps its number: the registry gives every upload a new one.

What a token holder sees names no server path: a folder source is shown by its last
name (``.../model``), long lists in the model's meta (training run ids) by their count
and a digest, and the service strips error messages of absolute paths
(:func:`scrub_paths`); the command line shows them whole.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from collapse_guard.features import DEFAULT_WINDOW
from collapse_guard.predictor.core.levels import RISK_LEVELS
from collapse_guard.predictor.core.version import content_version
from collapse_guard.service.client.wire import ModelInfo, SchemaInfo
from collapse_guard.service.server.scoring import ServedModel
from collapse_guard.service.server.windows import RunWindow, WindowBatch

__all__ = [
    "DEFAULT_SOURCE",
    "ModelHolder",
    "ModelLoadError",
    "ReloadBusy",
    "Serving",
    "alias_of",
    "known_window",
    "load_serving",
    "public_source",
    "scrub_paths",
]

DEFAULT_SOURCE = "default"  # the model bundled in the package
# meta entries that are bookkeeping, not evaluation figures or settings worth showing
_HIDDEN_META = {"split"}
_LONGEST_LIST = 20  # meta lists longer than this are shown as their count and a digest
# an absolute path: "/" not after a word character or a colon (models:/, runs:/, http://)
_PATH = re.compile(r"(?<![\w:/.])/(?:[^\s'\"/]+/)*([^\s'\"/]*)")


class ModelLoadError(Exception):
    """A model could not be loaded or failed its check; the old one keeps serving."""


class ReloadBusy(Exception):
    """Another reload is in progress in this worker."""


@dataclass(frozen=True)
class Serving:
    """A loaded, checked model and how it was found."""

    scorer: ServedModel
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


def _check(scorer: ServedModel) -> float:
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


def public_source(source: str) -> str:
    """``source`` as a token holder may see it: a folder by its last name only."""
    if source == DEFAULT_SOURCE or source.startswith(("models:/", "runs:/")):
        return source
    return f".../{Path(source).name}"


def scrub_paths(text: str) -> str:
    """``text`` with every absolute path cut to its last name (``.../model.txt``)."""
    return _PATH.sub(lambda m: f".../{m.group(1)}", text)


def _public(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _public(v) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) <= _LONGEST_LIST:
            return [_public(v) for v in value]
        text = json.dumps(value, sort_keys=True, default=str).encode()
        return {"count": len(value), "sha256": hashlib.sha256(text).hexdigest()[:16]}
    return scrub_paths(value) if isinstance(value, str) else value


def _info(scorer: ServedModel, source: str, alias: str | None) -> ModelInfo:
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
        source=public_source(source),
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
        levels=list(RISK_LEVELS),
        thresholds=model.thresholds,
        budgets={k: float(v) for k, v in model.budgets.items()},
        trained_at=meta.get("trained_at"),
        evaluation=figures,
        meta={k: _public(v) for k, v in meta.items() if k not in _HIDDEN_META},
    )


def _load_checked(source: str) -> tuple[Any, bool]:
    """The model of ``source``, its files checked and parsed by a child first
    (``RiskModel.load_folder``); and whether the registry numbered it (a registry
    version, whose number names one upload)."""
    from collapse_guard.predictor.core import store
    from collapse_guard.predictor.core.risk import DEFAULT_MODEL_DIR, RiskModel  # lightgbm

    if store.is_registry_uri(source):
        with store.fetched_model_folder(source) as (folder, stamp):  # a private download
            model = _named_as(source, folder, RiskModel.load_folder)
        model.meta |= {**stamp, "source": source}  # as RiskModel.load stamps it
        return model, bool(stamp)
    folder = DEFAULT_MODEL_DIR if source == DEFAULT_SOURCE else Path(source)
    # no private copy: the loader holds the bytes its child checked, and parses those
    return RiskModel.load_folder(folder), False


def _named_as(name: str, folder: Path, load: Callable[[Path], Any]) -> Any:
    """``load(folder)``; errors name ``name`` where they named the private download."""
    try:
        return load(folder)
    except Exception as error:
        raise ValueError(str(error).replace(str(folder), name)) from None


def load_serving(source: str | None) -> Serving:
    """Load ``source`` ('default', a folder, a models:/ or runs:/ URI) and check it.

    Any failure (missing folder, unknown alias, unreadable or crashing file, failed
    check) is a :class:`ModelLoadError` whose message says what and why (for a token
    holder, pass it through :func:`scrub_paths`).
    """
    source = source or DEFAULT_SOURCE
    try:
        model, numbered = _load_checked(source)
        scorer = ServedModel(model, str(model.meta["name"]), content_version(model, numbered))
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

    def reload(self, source: str | None, wait: float = 0.0) -> tuple[Serving, Serving, float]:
        """Load and check ``source`` (default: the current source), then swap it in.

        ``wait``: seconds to wait for a reload already running here (a client's request
        that lands while this worker follows another worker's reload waits for it rather
        than fail; the follower itself does not wait). Returns (new, previous, seconds).
        Raises :class:`ReloadBusy` when a reload is still running after ``wait``,
        :class:`ModelLoadError` when the new model is unusable: in both cases the current
        model keeps serving.
        """
        if not self._lock.acquire(timeout=wait if wait > 0 else -1, blocking=wait > 0):
            raise ReloadBusy(f"a reload is already in progress in this worker (waited {wait:g} s)")
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
