"""The promotion rule: each model at its own stored warn level, on the same unseen runs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from ops_fixtures import trained

from collapse_guard.predictor.lifecycle import promotion
from collapse_guard.predictor.lifecycle.promotion import WarnScore, decide


def _score(caught: int, false_alarms: int, *, n_collapsed: int = 10, healthy: int = 50_000):
    # budget 1 per 10k healthy steps: 5 expected on 50k steps, 10 allowed (2x)
    return WarnScore(
        version="x",
        threshold=0.5,
        budget_steps=10_000,
        n_runs=20,
        n_collapsed=n_collapsed,
        caught=caught,
        false_alarms=false_alarms,
        healthy_steps=healthy,
        median_lead=50.0,
    )


def test_the_budget_allows_twice_its_rate_and_at_least_one_alarm():
    assert _score(5, 10).allowed_false_alarms == 10 and _score(5, 10).within_budget
    assert not _score(5, 11).within_budget
    # 3,000 healthy steps: 0.3 expected; one alarm says nothing about a 1-per-10k budget
    assert _score(5, 1, healthy=3_000).within_budget
    assert not _score(5, 2, healthy=3_000).within_budget


@pytest.mark.parametrize(
    ("challenger", "champion", "promoted", "words"),
    [
        (_score(6, 3), _score(5, 0), True, "higher recall"),
        (_score(9, 11), _score(5, 0), False, "exceeds its warn false-alarm budget"),
        (_score(5, 3), _score(5, 3), False, "a tie keeps the champion"),
        (_score(5, 2), _score(5, 3), True, "the same recall with fewer false alarms"),
        (_score(4, 0), _score(5, 9), False, "no higher recall"),
        # no collapsing runs: recall cannot be measured, and ranks lowest
        (_score(0, 0, n_collapsed=0), _score(0, 1, n_collapsed=0), False, "no higher recall"),
        (_score(1, 0), _score(0, 0, n_collapsed=0), True, "higher recall"),
    ],
)
def test_the_rule(challenger, champion, promoted, words):
    decision = decide(challenger, champion)
    assert decision.promoted is promoted and words in decision.reason


def test_a_first_model_is_promoted():
    assert decide(_score(0, 20), None).promoted


def test_compare_scores_both_on_the_runs_neither_saw(tmp_path_factory):
    model, _, splits = trained(tmp_path_factory.getbasetemp())
    runs = [r for rs in splits.values() for r in rs]
    # a rival that saw nothing: only the model's own training and validation runs go
    rival = type(model).load_folder(model.save(tmp_path_factory.mktemp("rival")))
    rival.meta.update(train_run_ids=[], validation_run_ids=[], split={}, version="rival")
    decision = promotion.compare(model, rival, runs)
    assert list(decision.run_ids) == [r.run_id for r in splits["test"]]
    n_seen = len(splits["train"]) + len(splits["validation"])
    assert f"{n_seen} set apart" in decision.reason
    # the same model on the same runs at the same level: a tie, kept
    assert decision.challenger == replace(decision.champion, version=decision.challenger.version)
    assert not decision.promoted
    warn = model.thresholds["warn"]
    assert decision.challenger.threshold == warn and not math.isnan(decision.challenger.recall)


def test_compare_without_unseen_runs_keeps_the_champion(tmp_path_factory):
    model, _, splits = trained(tmp_path_factory.getbasetemp())
    decision = promotion.compare(model, model, splits["train"])
    assert not decision.promoted and "none of the" in decision.reason


def test_promotion_reads_the_risk_the_training_already_scored(training, monkeypatch):
    """The challenger's test runs were scored by evaluate_runs: promotion reuses that risk
    (EvalReport.model_runs) and gets the figures a fresh scoring gives."""
    from collapse_guard.predictor.core.risk import RiskModel

    model, runs = training.model, list(training.test_runs)
    fresh = promotion.score_at_warn(model, runs)
    assert sorted(training.report.model_runs) == sorted(r.run_id for r in runs)

    def no_scoring(*args, **kwargs):
        raise AssertionError("scored a run the training had scored")

    monkeypatch.setattr(RiskModel, "predict_run", no_scoring)
    assert promotion.score_at_warn(model, runs, training.report.model_runs) == fresh
    decision = promotion.compare(model, None, runs, training.report.model_runs)
    assert decision.promoted and decision.challenger == fresh
    with pytest.raises(AssertionError, match="scored a run"):
        promotion.score_at_warn(model, runs[:1])  # without them, it scores
