"""train_risk_model end to end: split without leakage, levels, determinism."""

from __future__ import annotations

from collapse_guard.predictor.train import train_risk_model
from collapse_guard.predictor.training_data import split_runs


def test_pipeline_meta_split_and_levels(trained, run_records):
    model, report = trained
    split = model.meta["split"]
    ids = [set(split[k]) for k in ("train", "validation", "test")]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert split == split_runs([r.meta for r in run_records], seed=0).to_dict()
    assert report.get("model")["n_runs"] == len(split["test"])
    assert model.meta["threshold_healthy_steps"] > 0
    assert model.horizon == 200 and model.meta["n_trees"] <= 60  # FAST_PARAMS in conftest


def test_same_seed_gives_the_same_model_string(synthetic_paths):
    paths = synthetic_paths[:30]
    kwargs = {"seed": 5, "stride": 25, "params": {"n_estimators": 15, "min_child_samples": 20}}
    a, _ = train_risk_model(paths, **kwargs)
    b, _ = train_risk_model(list(reversed(paths)), **kwargs)
    assert a.booster.model_to_string() == b.booster.model_to_string()
    assert a.thresholds == b.thresholds


def test_fresh_healthy_runs_stay_near_the_warn_budget(trained, fresh_paths):
    """Statistical check on runs never seen in training (alibi-detect style).

    The warn budget is 1 false alarm per 10,000 healthy steps, set on ~20k validation
    steps; on fresh runs the rate must stay within 5x of it. Caught collapses at
    `watch` come with a median lead time of at least 20 steps.
    """
    from collapse_guard.predictor.evaluation import ScoredRun, event_metrics
    from collapse_guard.predictor.training_data import load_runs

    model, _ = trained
    scored = []
    for run in load_runs(fresh_paths):
        steps = run.frame["step"].to_numpy()
        p = model.predict_run(run.frame, steps=steps).to_numpy()
        scored.append(ScoredRun(run.run_id, run.meta.source, steps, p, run.meta.onset_step))
    warn = event_metrics(scored, model.thresholds["warn"], horizon=model.horizon)
    assert warn["fa_per_10k"] <= 5 * 1e4 / model.budgets["warn"]
    watch = event_metrics(scored, model.thresholds["watch"], horizon=model.horizon)
    assert watch["caught"] > 0 and watch["median_lead"] >= 20
