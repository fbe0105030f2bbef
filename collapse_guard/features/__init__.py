"""Window of signals -> feature vector, one code path online and offline.

>>> from collapse_guard.features import FeatureExtractor
>>> fx = FeatureExtractor()                     # window=200, every canonical signal
>>> vec = fx.transform_window(frame)            # the window ending at the last row
>>> table = fx.transform_run(frame, stride=10)  # training rows, indexed by step
>>> fx.schema.names, fx.schema.fingerprint      # stored with every model

Imports numpy, pandas and numba only (never torch), so the predictor and the service
stay light. Feature names: :mod:`collapse_guard.features.schema`; window rule:
:mod:`collapse_guard.features.windows`; the kernel: :mod:`collapse_guard.features.stats`.
"""

from collapse_guard.features.extractor import DEFAULT_WINDOW, FeatureExtractor
from collapse_guard.features.schema import (
    FEATURE_VERSION,
    FeatureSchema,
    FeatureSchemaError,
    feature_names,
)
from collapse_guard.features.stats import window_features

__all__ = [
    "DEFAULT_WINDOW",
    "FEATURE_VERSION",
    "FeatureExtractor",
    "FeatureSchema",
    "FeatureSchemaError",
    "feature_names",
    "window_features",
]
