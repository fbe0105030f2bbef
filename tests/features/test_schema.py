"""FeatureSchema: names, round trip, fingerprint, validation messages."""

import json
from pathlib import Path

import pytest

from collapse_guard.features import (
    FEATURE_VERSION,
    FeatureExtractor,
    FeatureSchema,
    FeatureSchemaError,
    feature_names,
    window_feature_names,
)
from collapse_guard.features.context_fields import OPT_IN_CONTEXT
from collapse_guard.signals import SIGNAL_NAMES

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "collapse_guard/predictor/default_model"


def test_names_follow_the_pattern_and_order():
    names = feature_names(("grad_cv", "loss", "lr", "attn_kl", "update_cos"))
    stats = ("last", "mean", "std", "min", "max", "slope", "ewma_ratio", "zscore")
    assert names[:10] == tuple(f"grad_cv__{s}" for s in (*stats, "frac_over", "nonfinite"))
    # the loss is read relative to its window mean (shift), the LR relative to its scale
    shift = ("last_dev", "std", "min_dev", "max_dev", "slope", "ewma_dev", "zscore", "nonfinite")
    assert names[10:18] == tuple(f"loss__{s}" for s in shift)
    ratio = ("last_rel", "std_rel", "min_rel", "max_rel", "slope_rel", "ewma_ratio", "zscore")
    assert names[18:26] == tuple(f"lr__{s}" for s in (*ratio, "nonfinite"))
    assert "loss__frac_over" not in names  # > 10 nats: a raw level (log vocabulary)
    window = window_feature_names(("grad_cv", "loss", "lr", "attn_kl", "update_cos"))
    assert window[-2:] == ("dsi__count", "dsi__all_steps")
    assert names == window + names[len(window) :] and names[len(window)] == "ctx__steps"
    assert "dsi__count" not in feature_names(("loss", "grad_cv"))
    # only the context fields whose signals are there: steps, then the loss's three
    assert feature_names(("loss",))[8:] == (
        "ctx__steps",
        "ctx__loss_over_best",
        "ctx__loss_steps_since_best",
        "ctx__loss_over_early",
    )


def test_default_schema_size():
    schema = FeatureExtractor().schema
    assert schema.window == 200 and schema.signals == SIGNAL_NAMES
    # by hand from signals.py and features.readings: 22 signals read as levels (9
    # statistics, + frac_over for the 5 with a seed threshold: grad_cv, update_cos,
    # update_flips, attn_kl, attn_saturation; the line group's 3 among them), 16 read as
    # ratios (8 statistics), the loss as a shift (8), 2 DSI features, 12 context fields
    assert len(SIGNAL_NAMES) == 22 + 16 + 1
    assert len(schema.names) == 22 * 9 + 5 + 16 * 8 + 8 + 2 + 12 == 353
    assert len(set(schema.names)) == len(schema.names)
    assert schema.context == schema.names[-12:]


def test_round_trip_through_json_and_fingerprint():
    schema = FeatureExtractor(window=64, signals=("loss", "grad_norm")).schema
    back = FeatureSchema.from_dict(json.loads(json.dumps(schema.to_dict())))
    assert back == schema
    assert back.fingerprint == schema.fingerprint and len(schema.fingerprint) == 16
    assert schema.version == FEATURE_VERSION == "3"
    assert back.context == (
        "ctx__steps",
        "ctx__loss_over_best",
        "ctx__loss_steps_since_best",
        "ctx__loss_over_early",
        "ctx__grad_norm_over_long",
    )
    shorter = FeatureSchema.from_dict({**schema.to_dict(), "context": list(schema.context[:-1])})
    assert shorter.fingerprint != schema.fingerprint  # the context is in the fingerprint
    other = FeatureExtractor(window=65, signals=("loss", "grad_norm")).schema
    assert other.fingerprint != schema.fingerprint


def test_from_dict_rejects_wrong_keys():
    data = FeatureExtractor(signals=("loss",)).schema.to_dict()
    data["extra"] = 1
    del data["window"]
    with pytest.raises(FeatureSchemaError, match=r"missing \['window'\].*unexpected \['extra'\]"):
        FeatureSchema.from_dict(data)


def test_validate_lists_missing_and_unexpected():
    schema = FeatureExtractor(signals=("loss", "lr")).schema
    schema.validate(schema.names)
    got = [*schema.names[1:], "loss__median"]
    with pytest.raises(FeatureSchemaError) as err:
        schema.validate(got)
    message = str(err.value)
    assert "unexpected: loss__median" in message
    assert "missing: loss__last_dev" in message
    assert schema.fingerprint in message
    with pytest.raises(FeatureSchemaError, match="another order"):
        schema.validate(list(reversed(schema.names)))


def test_from_schema_reproduces_and_refuses_other_versions():
    schema = FeatureExtractor(window=50, signals=("loss", "grad_cv")).schema
    assert FeatureExtractor.from_schema(schema).schema == schema
    old = FeatureSchema("0", schema.window, schema.signals, schema.names)
    with pytest.raises(FeatureSchemaError, match="version 0"):
        FeatureExtractor.from_schema(old)


def test_opt_in_context_fields_leave_stored_schemas_as_they_are():
    # the bundled model's stored schema is what this code builds by default, to the
    # fingerprint: the opt-in fields are not in it, so its features (and risk) stay put
    stored = json.loads((DEFAULT_MODEL / "risk_model.json").read_text())["schema"]
    schema = FeatureSchema.from_dict(stored)
    assert FeatureSchema.build(schema.window, schema.signals) == schema
    assert not set(OPT_IN_CONTEXT) & set(schema.names)
    assert FeatureExtractor.from_schema(schema).extra_context == ()
    # asked for, they come last, change the fingerprint and are read back from the schema
    wider = FeatureExtractor(extra_context=OPT_IN_CONTEXT).schema
    default = FeatureExtractor().schema
    assert wider.names == default.names + OPT_IN_CONTEXT
    assert wider.context == default.context + OPT_IN_CONTEXT
    assert wider.fingerprint != default.fingerprint
    back = FeatureSchema.from_dict(json.loads(json.dumps(wider.to_dict())))
    assert FeatureExtractor.from_schema(back).schema == wider
