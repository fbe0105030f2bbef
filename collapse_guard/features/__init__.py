"""Window of signals -> feature vector, one code path online and offline.

>>> from collapse_guard.features import FeatureExtractor, RunContext
>>> fx = FeatureExtractor()                     # window=200, every canonical signal
>>> vec = fx.transform_window(frame)            # the window ending at the last row
>>> table = fx.transform_run(frame, stride=10)  # training rows, indexed by step
>>> fx.schema.names, fx.schema.fingerprint      # stored with every model
>>> ctx = RunContext.from_schema(fx.schema)     # live: ctx.update(step, record) each step
>>> vec = fx.transform_window(tail, context=ctx.get())

Imports numpy, pandas and numba only (never torch), so the predictor and the service
stay light. Feature names: :mod:`collapse_guard.features.schema`; how each signal's level
is read (scale-free where it depends on the model): :mod:`collapse_guard.features.readings`;
window rule: :mod:`collapse_guard.features.windows`; the kernel:
:mod:`collapse_guard.features.stats`; the run context: :mod:`collapse_guard.features.context`.
"""

from collapse_guard.features.context import RunContext
from collapse_guard.features.context_fields import CONTEXT_FIELDS, context_names
from collapse_guard.features.extractor import DEFAULT_WINDOW, FeatureExtractor
from collapse_guard.features.readings import READINGS, reading
from collapse_guard.features.schema import (
    FEATURE_VERSION,
    FeatureSchema,
    FeatureSchemaError,
    feature_names,
    window_feature_names,
)
from collapse_guard.features.stats import window_features

__all__ = [
    "CONTEXT_FIELDS",
    "DEFAULT_WINDOW",
    "FEATURE_VERSION",
    "READINGS",
    "FeatureExtractor",
    "FeatureSchema",
    "FeatureSchemaError",
    "RunContext",
    "context_names",
    "feature_names",
    "reading",
    "window_feature_names",
    "window_features",
]
