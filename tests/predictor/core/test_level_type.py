"""The Level type: ordered by severity, its own name wherever it is written or looked up."""

from __future__ import annotations

import json
import pickle
import re

import pytest

import collapse_guard.predictor as predictor
from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core import levels
from collapse_guard.predictor.core.levels import (
    CRITICAL,
    LEVELS,
    OK,
    RISK_LEVELS,
    WARN,
    WATCH,
    Level,
    level_of,
    thresholds_from_budgets,
)

_NAMES = "['ok', 'watch', 'warn', 'critical']"  # as an error lists them


def test_levels_are_ordered_by_severity_not_alphabetically():
    assert OK < WATCH < WARN < CRITICAL
    assert WATCH < WARN  # as strings "watch" > "warn"
    assert sorted([CRITICAL, OK, WARN, WATCH]) == list(RISK_LEVELS)
    assert max(LEVELS) is CRITICAL and min(RISK_LEVELS) is OK
    assert [level >= WARN for level in RISK_LEVELS] == [False, False, True, True]
    assert [level.rank for level in RISK_LEVELS] == [0, 1, 2, 3]


def test_the_tuples_hold_levels_lowest_first():
    assert RISK_LEVELS == (OK, *LEVELS) and LEVELS == (WATCH, WARN, CRITICAL)
    assert all(isinstance(level, Level) for level in RISK_LEVELS)
    assert list(Level) == list(RISK_LEVELS)


def test_a_level_compares_with_its_name():
    assert WARN == "warn" and "warn" == WARN and WARN != "watch"
    assert WARN >= "watch" and "critical" > WARN and "ok" <= OK
    assert "warn" in RISK_LEVELS and "high" not in RISK_LEVELS
    assert WARN != "high"  # equality with any other string is False, never an error


@pytest.mark.parametrize(
    "compare",
    [
        lambda: WARN >= "high",
        lambda: WARN < "Warn",  # names are lower case
        lambda: "high" < WARN,
        lambda: OK > "",
    ],
)
def test_ordering_against_a_string_that_is_no_level_says_which_names_are(compare):
    with pytest.raises(UserInputError, match=f"is not one of {re.escape(_NAMES)}"):
        compare()


@pytest.mark.parametrize("other", [2, 0.5, None, b"warn"])
def test_ordering_against_a_non_string_is_a_type_error(other):
    with pytest.raises(TypeError):
        WARN < other  # noqa: B015 (the comparison is the test)


def test_parse_takes_a_level_or_its_name():
    assert Level.parse("warn") is WARN and Level.parse(WARN) is WARN
    assert [Level.parse(name) for name in ("ok", "watch", "warn", "critical")] == list(RISK_LEVELS)


@pytest.mark.parametrize("bad", ["WARN", "high", "", " warn", 2, None])
def test_parse_refuses_anything_else_naming_the_four(bad):
    with pytest.raises(UserInputError) as error:
        Level.parse(bad)
    assert repr(bad) in error.value.message
    assert _NAMES in error.value.message
    assert error.value.hint  # what to do
    assert isinstance(error.value, ValueError)  # code catching bad values keeps working


def test_str_format_and_json_give_the_name():
    assert str(WARN) == "warn" and f"{WARN}" == "warn"
    assert "%s" % WARN == "warn"  # noqa: UP031 (as logging formats it)
    assert f"{WATCH:>7}|{OK:<4}|" == "  watch|ok  |"
    assert "-".join(RISK_LEVELS) == "ok-watch-warn-critical"
    assert json.dumps(WARN) == '"warn"' and json.dumps([OK, CRITICAL]) == '["ok", "critical"]'
    assert json.dumps({WARN: 1}) == '{"warn": 1}'
    assert json.loads(json.dumps(CRITICAL)) == CRITICAL
    assert pickle.loads(pickle.dumps(WARN)) is WARN


def test_a_dict_is_looked_up_by_level_or_name_alike():
    by_name = {"watch": 1, "warn": 2, "critical": 3}
    assert [by_name[level] for level in LEVELS] == [1, 2, 3]
    assert {WARN: 2}["warn"] == 2 and hash(WARN) == hash("warn")
    assert WARN in by_name and set(by_name) == set(LEVELS)


def test_level_of_returns_a_level():
    th = {"watch": 0.1, "warn": 0.3, "critical": 0.7}
    got = [level_of(p, th) for p in (0.0, 0.2, 0.5, 0.9, float("nan"))]
    assert got == [OK, WATCH, WARN, CRITICAL, OK]
    assert all(type(level) is Level for level in got)


def test_thresholds_are_keyed_by_the_names():
    # a Level key would sort by severity under json's sort_keys: stored files would change
    th = thresholds_from_budgets([[0.1, 0.2, 0.3] * 10], {"watch": 2, "warn": 5, "critical": 9})
    assert list(th) == ["watch", "warn", "critical"]
    assert all(type(name) is str for name in th)


def test_a_model_given_levels_as_keys_stores_what_names_give(tmp_path):
    from collapse_guard.predictor.core.risk import RiskModel

    model = RiskModel.load()
    fingerprint = model.fingerprint()
    by_name = model.save(tmp_path / "by_name") / "risk_model.json"
    model.with_thresholds({Level(name): p for name, p in model.thresholds.items()})
    assert all(type(name) is str for name in model.thresholds)
    assert model.fingerprint() == fingerprint
    by_level = model.save(tmp_path / "by_level") / "risk_model.json"
    assert by_level.read_bytes() == by_name.read_bytes()
    assert type(model.level(1.0)) is Level and model.level(1.0) is CRITICAL


def test_the_package_exports_the_level_type():
    for name in ("Level", "OK", "WATCH", "WARN", "CRITICAL"):
        assert getattr(predictor, name) is getattr(levels, name)
        assert name in predictor.__all__


def test_promotion_is_judged_at_the_warn_level():
    from collapse_guard.predictor.lifecycle import promotion

    assert promotion.WARN is WARN
