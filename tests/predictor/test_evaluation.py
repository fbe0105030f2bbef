"""Event-level metrics on hand-made score traces, and a full report on synthetic runs."""

from __future__ import annotations

import json
import math

import numpy as np

from collapse_guard.predictor.evaluation import (
    ScoredRun,
    event_metrics,
    healthy_sequences,
    row_metrics,
    threshold_at_budget,
)
from collapse_guard.predictor.levels import episode_counts


def _run(scores, onset=None, run_id="r", source="synthetic"):
    scores = np.asarray(scores, dtype=float)
    return ScoredRun(run_id, source, np.arange(scores.size), scores, onset)


def _collapsing(alarm_steps, onset=1_000, n=1_100):
    s = np.zeros(n)
    for a, b in alarm_steps:
        s[a:b] = 1.0
    return _run(s, onset)


def test_caught_lead_time_and_false_alarms_follow_the_definition():
    H = 200
    caught = _collapsing([(900, 1_000)])  # first alarm 100 steps ahead
    too_late = _collapsing([(995, 1_000)])  # 5 steps ahead: no time to act
    early = _collapsing([(700, 720), (950, 1_000)])  # one false alarm, then caught at 50
    running = _collapsing([(700, 1_000)])  # starts too early, still on in the window
    healthy = _run(np.r_[np.zeros(100), np.ones(5), np.zeros(100), np.ones(3), np.zeros(792)])
    m = event_metrics([caught, too_late, early, running, healthy], 0.5, horizon=H)
    assert (m["n_collapsed"], m["caught"]) == (4, 3)
    assert sorted(m["lead_times"]) == [50, 100, 200]
    assert m["median_lead"] == 100
    assert m["false_alarms"] == 2 + 1 + 1  # healthy run's two episodes, early's, running's
    assert m["healthy_steps"] == 1_000 + 4 * 800
    assert math.isclose(m["fa_per_10k"], 1e4 * 4 / 4_200)


def test_alarms_after_onset_are_neither_caught_nor_false():
    m = event_metrics([_collapsing([(1_000, 1_100)])], 0.5)
    assert (m["caught"], m["false_alarms"]) == (0, 0)


def test_threshold_at_budget_keeps_false_alarms_within_budget():
    rng = np.random.default_rng(0)
    runs = [_run(rng.random(2_000), run_id=f"h{i}") for i in range(20)]
    runs += [_run(np.r_[rng.random(1_000), np.linspace(1, 2, 100)], onset=1_100, run_id="c")]
    t = threshold_at_budget(runs, budget_per_10k=5.0)
    m = event_metrics(runs, t)
    assert m["fa_per_10k"] <= 5.0 and m["caught"] == 1
    seqs = healthy_sequences(runs)
    values = np.concatenate(seqs)
    lower = values[values < t].max()  # the next lower threshold that changes anything
    assert episode_counts(seqs, np.array([lower]))[0] > 5.0 * m["healthy_steps"] / 1e4


def test_row_metrics_of_a_perfect_scorer():
    s = np.r_[np.zeros(800), np.ones(200)]  # 1 exactly on the H steps before onset
    r = row_metrics([_run(s, onset=1_000), _run(np.zeros(500))], probabilistic=True)
    assert r["pr_auc"] == 1.0 and r["roc_auc"] == 1.0 and r["brier"] == 0.0


def test_report_has_every_scorer_source_and_operating_point(trained):
    _, report = trained
    frame = report.to_frame()
    assert set(frame["scorer"]) == {
        "model",
        "dsi",
        "olmo_zscore",
        "zclip",
        "kill_spike",
        "config_only",
    }
    points = set(frame.loc[frame.scorer == "model", "operating_point"])
    assert points == {"budget", "level:watch", "level:warn", "level:critical"}
    assert set(frame.loc[frame.scorer == "dsi", "operating_point"]) == {"budget", "native"}
    assert set(frame["source"]) == {"all", "synthetic"}
    # at its budget threshold a scorer stays within budget, unless +inf scores (a measured
    # blow-up) alarm at any threshold
    budget_rows = frame[(frame.operating_point == "budget") & (frame.source == "all")]
    within = budget_rows["fa_per_10k"] <= report.budget_per_10k
    assert (within | np.isinf(budget_rows["threshold"])).all()
    assert within[budget_rows.scorer == "model"].all()
    json.dumps(report.to_dict())  # serialisable as is
    metrics = report.to_metrics()
    assert "model/all/budget/recall" in metrics
    assert all(math.isfinite(v) for v in metrics.values())
    assert report.get("model")["n_runs"] == report.get("dsi")["n_runs"] > 0
