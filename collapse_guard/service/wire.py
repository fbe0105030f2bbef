"""Moved to :mod:`collapse_guard.service.client.wire`; this path is kept for one release."""

from collapse_guard.service.client.wire import (
    ERROR_EXAMPLE,
    MAX_TOP_K,
    NUMBER_TEXT,
    ErrorBody,
    ExplainResponse,
    Factor,
    FeatureContribution,
    ModelInfo,
    ReloadRequest,
    ReloadResponse,
    RiskRequest,
    RiskResponse,
    RiskResult,
    Run,
    SchemaInfo,
    SignalContribution,
)

__all__ = [
    "ERROR_EXAMPLE",
    "MAX_TOP_K",
    "NUMBER_TEXT",
    "ErrorBody",
    "ExplainResponse",
    "Factor",
    "FeatureContribution",
    "ModelInfo",
    "ReloadRequest",
    "ReloadResponse",
    "RiskRequest",
    "RiskResponse",
    "RiskResult",
    "Run",
    "SchemaInfo",
    "SignalContribution",
]
