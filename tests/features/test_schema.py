"""FeatureSchema: names, round trip, fingerprint, validation messages."""

import json

import pytest

from collapse_guard.features import (
    FEATURE_VERSION,
    FeatureExtractor,
    FeatureSchema,
    FeatureSchemaError,
    feature_names,
)
from collapse_guard.signals import SIGNAL_NAMES, SIGNALS


def test_names_follow_the_pattern_and_order():
    names = feature_names(("loss", "lr", "grad_cv", "attn_kl", "update_cos"))
    stats = ("last", "mean", "std", "min", "max", "slope", "ewma_ratio", "zscore")
    assert names[:10] == tuple(f"loss__{s}" for s in (*stats, "frac_over", "nonfinite"))
    assert "lr__frac_over" not in names  # lr has no seed threshold
    assert names[-2:] == ("dsi__count", "dsi__all_steps")
    assert "dsi__count" not in feature_names(("loss", "grad_cv"))


def test_default_schema_size():
    n_thr = sum(s.has_threshold for s in SIGNALS)
    schema = FeatureExtractor().schema
    assert schema.window == 200 and schema.signals == SIGNAL_NAMES
    assert len(schema.names) == 9 * len(SIGNALS) + n_thr + 2
    assert len(set(schema.names)) == len(schema.names)


def test_round_trip_through_json_and_fingerprint():
    schema = FeatureExtractor(window=64, signals=("loss", "grad_norm")).schema
    back = FeatureSchema.from_dict(json.loads(json.dumps(schema.to_dict())))
    assert back == schema
    assert back.fingerprint == schema.fingerprint and len(schema.fingerprint) == 16
    assert schema.version == FEATURE_VERSION
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
    assert "missing: loss__last" in message
    assert schema.fingerprint in message
    with pytest.raises(FeatureSchemaError, match="another order"):
        schema.validate(list(reversed(schema.names)))


def test_from_schema_reproduces_and_refuses_other_versions():
    schema = FeatureExtractor(window=50, signals=("loss", "grad_cv")).schema
    assert FeatureExtractor.from_schema(schema).schema == schema
    old = FeatureSchema("0", schema.window, schema.signals, schema.names)
    with pytest.raises(FeatureSchemaError, match="version 0"):
        FeatureExtractor.from_schema(old)
