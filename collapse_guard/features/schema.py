"""The feature schema: which features, in which order, from which window.

A model is only valid for the exact feature list it was trained on, so the schema is
stored with every model and checked before every prediction. Its ``fingerprint`` is
a short hash that services and MLflow runs quote to say "these features".

Feature names follow ``<signal>__<stat>`` for per-signal features, ``dsi__<stat>``
for the cross-signal ones and ``ctx__<field>`` for the run context. Which statistics a
signal gets depends on how its level is read (:mod:`collapse_guard.features.readings`):

=====================  ==================================================================
name pattern           meaning (over the finite values of the last ``window`` steps)
=====================  ==================================================================
``<s>__last``          last finite value (signals measured every 50/100 steps: last probe)
``<s>__mean``          mean
``<s>__std``           population standard deviation (ddof=0)
``<s>__min``           minimum
``<s>__max``           maximum
``<s>__slope``         least-squares slope against the step, per step
``<s>__ewma_ratio``    EWMA(span 10) / EWMA(span 100), both weighted by distance from now
``<s>__zscore``        (last - mean) / std; NaN when the window is constant
``<s>__frac_over``     share of finite values over the seed threshold (thresholded only)
``<s>__nonfinite``     count of measured non-finite values (inf, or NaN flagged measured)
``<s>__<x>_rel``       ratio reading: last, std, min, max or slope divided by the mean
``<s>__<x>_dev``       shift reading: last, min, max minus the mean; ewma_dev = short
                       EWMA minus long EWMA
``dsi__count``         how many of grad_cv, attn_kl, update_cos are over threshold now
``dsi__all_steps``     for how many trailing steps all three have been over threshold
``ctx__<field>``       the run so far, not only the window (``features.context``)
=====================  ==================================================================

Every feature of a signal with no measurement in the window is NaN (never 0: LightGBM
reads NaN as missing). ``<s>__frac_over`` exists only for signals read as levels with a
seed threshold (``Signal.has_threshold``); the ``dsi__*`` features exist only when all
three DSI signals are in the schema's signals; a ``ctx__`` field exists when the
signals it reads are in the schema's signals, and an opt-in one
(``context_fields.OPT_IN_CONTEXT``) only when the schema was built with it
(``extra_context``): a stored schema lists its context fields, so one without them
keeps its fields, fingerprint and values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collapse_guard.features.context_fields import context_names
from collapse_guard.features.readings import LEVEL, RATIO, SHIFT, reading
from collapse_guard.signals import DSI_SIGNALS, signal

__all__ = [
    "ALL_STATS",
    "CROSS_STATS",
    "FEATURE_VERSION",
    "READING_STATS",
    "SIGNAL_STATS",
    "FeatureSchema",
    "FeatureSchemaError",
    "feature_names",
    "has_dsi",
    "window_feature_names",
]

# Bump whenever a statistic, its constants or the window rule changes: a model trained
# on one version must never be fed vectors computed by another. Version 2: the compiled
# kernel, whose sums run in step order (values differ from version 1 in the last bits).
# Version 3: scale-free and shift-free readings (features.readings) and the run context.
FEATURE_VERSION = "3"

# The statistics of a signal read as a level, in feature order.
SIGNAL_STATS: tuple[str, ...] = (
    "last",
    "mean",
    "std",
    "min",
    "max",
    "slope",
    "ewma_ratio",
    "zscore",
    "frac_over",
    "nonfinite",
)
READING_STATS: dict[str, tuple[str, ...]] = {
    LEVEL: SIGNAL_STATS,
    RATIO: (
        "last_rel",
        "std_rel",
        "min_rel",
        "max_rel",
        "slope_rel",
        "ewma_ratio",
        "zscore",
        "nonfinite",
    ),
    SHIFT: ("last_dev", "std", "min_dev", "max_dev", "slope", "ewma_dev", "zscore", "nonfinite"),
}
# Every statistic the kernel computes, in the order it returns them (features.stats).
ALL_STATS: tuple[str, ...] = tuple(dict.fromkeys(s for v in READING_STATS.values() for s in v))
CROSS_STATS: tuple[str, ...] = ("count", "all_steps")


class FeatureSchemaError(ValueError):
    """Feature names or a stored schema do not match what the code expects."""


def _stats_for(name: str) -> tuple[str, ...]:
    stats = READING_STATS[reading(name)]
    if signal(name).has_threshold:
        return stats
    return tuple(s for s in stats if s != "frac_over")


def has_dsi(signals: Sequence[str]) -> bool:
    """True when the cross-signal DSI features are computed for these signals."""
    return all(s in signals for s in DSI_SIGNALS)


def window_feature_names(signals: Sequence[str]) -> tuple[str, ...]:
    """The ordered window features for ``signals`` (signal order, then stat order, then
    the DSI features): what the kernel computes, without the run context."""
    names = [f"{s}__{stat}" for s in signals for stat in _stats_for(s)]
    if has_dsi(signals):
        names += [f"dsi__{stat}" for stat in CROSS_STATS]
    return tuple(names)


def feature_names(signals: Sequence[str], extra_context: Sequence[str] = ()) -> tuple[str, ...]:
    """The ordered feature names for ``signals``: the window's, then the run context's
    (with the opt-in fields of ``extra_context``)."""
    return window_feature_names(signals) + context_names(signals, extra_context)


@dataclass(frozen=True)
class FeatureSchema:
    """Names, order, version and window length of a feature vector.

    Build one with :meth:`build` (or take ``FeatureExtractor(...).schema``); store it
    with :meth:`to_dict` and load it with :meth:`from_dict`.
    """

    version: str
    window: int
    signals: tuple[str, ...]
    names: tuple[str, ...]
    # the run-context features (also the last entries of ``names``): the keys of a
    # context mapping (``RunContext.get()``, a service request's ``context``)
    context: tuple[str, ...] = ()

    @classmethod
    def build(
        cls, window: int, signals: Sequence[str], extra_context: Sequence[str] = ()
    ) -> FeatureSchema:
        """The schema this code version produces for ``window`` and ``signals``, with
        the opt-in context fields of ``extra_context`` (default none: the schema every
        model before them was trained on)."""
        signals = tuple(signals)
        names = feature_names(signals, extra_context)
        return cls(
            FEATURE_VERSION, int(window), signals, names, context_names(signals, extra_context)
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (lists, not tuples)."""
        return {
            "version": self.version,
            "window": self.window,
            "signals": list(self.signals),
            "names": list(self.names),
            "context": list(self.context),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureSchema:
        """Inverse of :meth:`to_dict`; rejects missing or unknown keys."""
        expected = {"version", "window", "signals", "names", "context"}
        got = set(data)
        if got != expected:
            raise FeatureSchemaError(
                f"feature schema dict must have keys {sorted(expected)}; got {sorted(got)} "
                f"(missing {sorted(expected - got)}, unexpected {sorted(got - expected)}); "
                "build it with FeatureSchema.to_dict()"
            )
        return cls(
            version=str(data["version"]),
            window=int(data["window"]),
            signals=tuple(str(s) for s in data["signals"]),
            names=tuple(str(n) for n in data["names"]),
            context=tuple(str(n) for n in data["context"]),
        )

    @property
    def fingerprint(self) -> str:
        """First 16 hex digits of the sha256 of the canonical JSON of :meth:`to_dict`."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def validate(self, names: Sequence[str]) -> None:
        """Raise :class:`FeatureSchemaError` unless ``names`` equals ``self.names``.

        The message lists the names missing and the unexpected ones (as scikit-learn
        does), or says that only the order differs.
        """
        names = tuple(names)
        if names == self.names:
            return
        missing = [n for n in self.names if n not in set(names)]
        unexpected = [n for n in names if n not in set(self.names)]
        if not missing and not unexpected:
            raise FeatureSchemaError(
                f"feature names are the expected ones but in another order "
                f"(schema {self.fingerprint}, version {self.version}); "
                "reorder the columns as schema.names"
            )
        parts = [f"feature names do not match schema {self.fingerprint} (version {self.version})"]
        if unexpected:
            parts.append("unexpected: " + ", ".join(unexpected))
        if missing:
            parts.append("missing: " + ", ".join(missing))
        parts.append("compute features with FeatureExtractor.from_schema(schema)")
        raise FeatureSchemaError("; ".join(parts))
