"""The wire format: typed requests and answers of every route (pydantic models).

Shared by the service (which validates with them and publishes them in ``/docs.json``)
and the client (which reads answers into them). Fields may be added, never renamed
(docs/design.md, "Service"). A level is a :class:`~collapse_guard.predictor.core.levels.Level`,
its name on the wire (``"ok"``, ``"watch"``, ``"warn"``, ``"critical"``).

Numbers. A signal value is a JSON number, ``null`` (not measured at that step), or a
measured non-finite value written either as the strings ``"NaN"``, ``"Infinity"``,
``"-Infinity"`` or as the bare literals ``NaN``, ``Infinity``, ``-Infinity`` that
Python's ``json.dumps`` writes by default. Both forms are read the same way. Strings
holding a number as JSON writes one (``"2.5"``, ``"-1e-3"``) are read as that number;
any other string, a boolean, a list or an object is rejected with a 400 that names the
field. Steps and ``top_k`` are JSON integers (not booleans, not ``2.0``). The published
schema (``/docs.json``) says exactly this, so that what it allows is what is read.

Answers, as the client reads them: strictly (pydantic's strict mode on every field:
``true`` and ``"0.5"`` are not numbers, ``"50"`` and ``50.0`` not integers, a level one of
the four names exactly), a probability finite in [0, 1] and a ``hold_steps`` in [0,
:data:`MAX_HOLD_STEPS`]; anything else is refused (``RiskClient``: ``InvalidAnswer``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, WithJsonSchema
from pydantic_core import PydanticCustomError

from collapse_guard.predictor.core.hold import MAX_HOLD_STEPS
from collapse_guard.predictor.core.levels import Level

__all__ = [
    "ERROR_EXAMPLE",
    "MAX_HOLD_STEPS",
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

# Top contributing features per run a /risk answer may hold (the service's Limits.max_top_k;
# /explain gives them all)
MAX_TOP_K = 50


# a number as JSON writes one, or a non-finite value's name: the strings a value may be
NUMBER_TEXT = r"^(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|NaN|Infinity|-Infinity)$"
_NUMBER_TEXT = re.compile(NUMBER_TEXT)


def _number_or_null(value: Any) -> Any:
    # pydantic reads true as 1.0 and " +1_0 " as 10.0 for a float; the schema allows
    # neither (one call a value: the general reader only, ~20 % of its time)
    if type(value) is bool:
        raise PydanticCustomError("float_type", "Input should be a valid number, not a boolean")
    if isinstance(value, str) and not _NUMBER_TEXT.match(value):
        raise PydanticCustomError(
            "float_parsing", "Input should be a number, or a string holding one as JSON writes it"
        )
    return value


# float | None: None is "not measured" (NaN to the features, never 0)
Value = Annotated[
    float | None,
    BeforeValidator(_number_or_null),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number"},
                {"type": "null"},
                {"type": "string", "pattern": NUMBER_TEXT},
            ]
        }
    ),
]

_VALUE_DOC = (
    'numbers; null = not measured; "NaN", "Infinity", "-Infinity" (or the bare JSON '
    "literals) = measured non-finite"
)


class Run(BaseModel):
    """The raw signal window of one run: steps plus one column per signal."""

    run_id: str = Field(description="The caller's id of the run, echoed in the answer.")
    steps: list[StrictInt] = Field(
        min_length=1,
        description="Training steps of the rows, strictly increasing; the last one is 'now'.",
        examples=[[0, 1, 2]],
    )
    signals: dict[str, list[Value]] = Field(
        description=f"Signal name -> one value per step ({_VALUE_DOC}). Canonical names "
        "only (GET /model lists the ones the model reads); absent signals are NaN features.",
        examples=[{"loss": [2.41, None, "NaN"], "grad_norm": [0.9, 0.8, 0.85]}],
    )
    context: dict[str, Value] | None = Field(
        default=None,
        description="Run-level context (GET /model: schema.context). Absent or null keys "
        "give NaN features.",
    )


class RiskRequest(BaseModel):
    """``POST /risk`` and ``POST /explain`` (exactly one run) as JSON."""

    runs: list[Run] = Field(
        min_length=1, description="One entry per run; answers come back in this order."
    )
    top_k: StrictInt = Field(
        default=5,
        ge=0,
        le=MAX_TOP_K,
        description="Top contributing features per run in the answer.",
    )


class Factor(BaseModel):
    """One feature's contribution to the log-odds (LightGBM SHAP, positive: toward collapse)."""

    feature: str
    signal: str = Field(description="The signal the feature is computed from ('dsi': cross).")
    contribution: float


class RiskResult(BaseModel):
    """The risk of one run at its last step."""

    run_id: str
    step: int = Field(description="The step the risk refers to (the window's last step).")
    probability: float = Field(description="Calibrated P(collapse within `horizon` steps).")
    level: Level
    horizon: int
    hold_steps: int = Field(
        description="The model's levels are set on the risk held this many steps: a loop "
        "alarms on the highest level it was told in its last `hold_steps` steps."
    )
    model_name: str
    model_version: str
    top_factors: list[Factor]
    reason: str | None = Field(
        default=None,
        description="Why the level is above the probability's own: the run's latest "
        "measured loss or grad_norm is NaN/inf, a collapse now (level critical). null: "
        "the level is the forecast's.",
    )


class RiskResponse(BaseModel):
    results: list[RiskResult]


class FeatureContribution(BaseModel):
    feature: str
    value: float | None = Field(description="The feature's value (null: NaN, missing).")
    contribution: float


class SignalContribution(BaseModel):
    signal: str
    contribution: float = Field(description="Sum of the signal's feature contributions.")
    features: list[FeatureContribution]


class ExplainResponse(BaseModel):
    """Every feature's contribution for one window, grouped by signal (largest |sum| first)."""

    run_id: str
    step: int
    probability: float
    level: Level
    model_name: str
    model_version: str
    base_log_odds: float = Field(description="The booster's expected raw score.")
    log_odds: float = Field(description="base_log_odds + every contribution (uncalibrated).")
    signals: list[SignalContribution]
    reason: str | None = Field(default=None, description="As in RiskResult.")


class SchemaInfo(BaseModel):
    version: str
    window: int
    signals: list[str]
    context: list[str]
    fingerprint: str
    names: list[str]


class ModelInfo(BaseModel):
    """``GET /model``: what is serving now."""

    name: str
    version: str
    alias: str | None = Field(description="The registry alias it was loaded by, if any.")
    source: str = Field(description="What was loaded: 'default', a folder or a models:/ URI.")
    horizon: int
    hold_steps: int = Field(description="The levels are for the risk held this many steps.")
    feature_schema: SchemaInfo
    levels: list[Level]
    thresholds: dict[str, float]
    budgets: dict[str, float]
    trained_at: str | None
    evaluation: dict[str, float] = Field(description="The figures stored with the model.")
    meta: dict[str, Any]


class ReloadRequest(BaseModel):
    source: str | None = Field(
        default=None,
        description="Model to load: 'default', a folder, or a models:/ URI; omitted: the "
        "source the service was started with (a models:/...@alias is resolved again).",
        examples=["models:/collapse-predictor@champion"],
    )


class ReloadResponse(BaseModel):
    reloaded: bool = Field(description="False when the source resolved to the serving model.")
    previous_version: str
    model: ModelInfo
    check_probability: float = Field(description="The new model's answer on the known window.")
    seconds: float


class ErrorBody(BaseModel):
    """Every 4xx: what was wrong, where, what was expected and how to fix it."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(description="One sentence: field, what was got, expected, fix.")
    field: str | None = None
    expected: str | None = None
    fix: str | None = None


ERROR_EXAMPLE = {
    "error": "runs[0].signals.los: unknown signal; expected one of loss, lr, ... Fix: use "
    "the canonical names (GET /model)",
    "field": "runs[0].signals.los",
    "expected": "one of loss, lr, ...",
    "fix": "use the canonical names (GET /model)",
}
