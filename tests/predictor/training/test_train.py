"""train_risk_model end to end: split without leakage, levels, determinism."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core.levels import thresholds_from_budgets
from collapse_guard.predictor.training.data import MODEL_SIGNALS, split_runs
from collapse_guard.predictor.training.train import set_levels, train_risk_model
from collapse_guard.runfiles import RunMeta, read_meta
from collapse_guard.runfiles.records import RunRecord


def test_pipeline_meta_split_and_levels(trained, run_records):
    model, report = trained
    split = model.meta["split"]
    ids = [set(split[k]) for k in ("train", "validation", "test")]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert split == split_runs([r.meta for r in run_records], seed=0).to_dict()
    assert report.result("model", operating_point="budget").events.n_runs == len(split["test"])
    assert model.meta["threshold_healthy_steps"] > 0
    assert model.horizon == 200 and model.meta["n_trees"] <= 60  # FAST_PARAMS in predictor_settings
    # the machine's telemetry is recorded but never predicted from
    assert model.schema.signals == MODEL_SIGNALS
    assert "host_mem_available" not in MODEL_SIGNALS and "attn_kl" in MODEL_SIGNALS
    assert not any(name.startswith(("host_mem", "gpu_")) for name in model.schema.names)


def test_same_seed_gives_the_same_model_string(synthetic_paths):
    paths = synthetic_paths[:30]
    kwargs = {"seed": 5, "stride": 25, "params": {"n_estimators": 15, "min_child_samples": 20}}
    a = train_risk_model(paths, **kwargs)
    b = train_risk_model(list(reversed(paths)), **kwargs)
    assert a.model.booster.model_to_string() == b.model.booster.model_to_string()
    assert a.model.thresholds == b.model.thresholds
    assert a.fingerprint == b.fingerprint and a.runs == b.runs


def test_too_few_runs_are_refused_before_any_fit(synthetic_paths, monkeypatch):
    """One collapse and one healthy run: no split can hold both in train and validation."""
    import collapse_guard.predictor.training.train as train_module

    def fit(*args, **kwargs):
        raise AssertionError("fitted on runs that were to be refused")

    monkeypatch.setattr(train_module, "fit_risk_model", fit)
    collapsed = next(p for p in synthetic_paths if read_meta(p).onset_step is not None)
    healthy = next(p for p in synthetic_paths if read_meta(p).onset_step is None)
    with pytest.raises(UserInputError) as caught:
        train_risk_model([collapsed, healthy], seed=0)
    message = str(caught.value)
    assert message.startswith("too few runs to train: 2 runs (1 healthy, 1 collapsed)")
    assert "no collapsed run in validation" in message and "no run in test" in message
    assert "collapse-guard data synth" in message


def test_fresh_healthy_runs_stay_near_the_watch_budget(trained, fresh_paths):
    """Statistical check on runs never seen in training (alibi-detect style).

    The thresholds rest on the healthy validation steps (~5,500 here). `watch` (1 false
    alarm per 1,000 healthy steps) is a quantile set by ~5 alarms there, so on fresh
    runs its rate must stay within 5x of the budget; `warn` and `critical` rest on none
    (fewer steps than their budgets), too few to bound. Caught collapses at `watch`
    come with a median lead time of at least 20 steps.
    """
    from collapse_guard.predictor.evaluate import ScoredRun, event_metrics
    from collapse_guard.runfiles.records import load_runs

    model, _ = trained
    scored = []
    for run in load_runs(fresh_paths):
        steps = run.frame["step"].to_numpy()
        p = model.predict_run(run.frame, steps=steps).to_numpy()
        scored.append(ScoredRun(run.run_id, run.meta.source, steps, p, run.meta.onset_step))
    watch = event_metrics(scored, model.thresholds["watch"], horizon=model.horizon)
    assert model.meta["threshold_healthy_steps"] >= 2 * model.budgets["watch"]
    assert watch.fa_per_10k <= 5 * 1e4 / model.budgets["watch"]
    assert watch.caught > 0 and watch.median_lead >= 20


def test_the_result_holds_one_fingerprint_and_the_split_it_made(training, run_records):
    from collapse_guard.predictor.training.train import SplitRecord, TrainingResult
    from collapse_guard.runfiles.records import data_fingerprint

    assert isinstance(training, TrainingResult)
    # one fingerprint: the result's, the model's and training_data's agree
    assert training.fingerprint == data_fingerprint(run_records)
    assert training.model.meta["data_fingerprint"] == training.fingerprint
    split = training.model.meta["split"]
    assert {role: training.ids(role) for role in split} == {k: sorted(v) for k, v in split.items()}
    assert training.counts() == training.model.meta["n_runs"]
    assert [r.run_id for r in training.test_runs] == sorted(split["test"])
    by_id = {r.run_id: r for r in run_records}
    for record in training.runs:
        meta = by_id[record.run_id].meta
        assert record.source == meta.source and record.onset_step == meta.onset_step
        assert record.family == "synthetic"
        assert (record.kind is None) == (meta.onset_step is None)
    assert {r.kind for r in training.runs if r.collapsed} >= {"nonfinite"}
    assert SplitRecord.__dataclass_params__.frozen and TrainingResult.__dataclass_params__.frozen


def test_the_model_stores_the_runs_it_trained_and_validated_on(trained):
    from collapse_guard.predictor.core.seen_runs import SeenRuns

    model, _ = trained
    split = model.meta["split"]
    assert model.meta["train_run_ids"] == sorted(split["train"])
    assert model.meta["validation_run_ids"] == sorted(split["validation"])
    seen = SeenRuns.from_meta(model.meta)
    assert {seen.role_of(i) for i in split["train"]} == {"train"}
    assert {seen.role_of(i) for i in split["validation"]} == {"validation"}
    assert {seen.role_of(i) for i in split["test"]} == {None}


def test_the_headline_is_recorded_at_the_stored_warn_level(trained):
    model, report = trained
    warn = report.result("model")
    assert warn.operating_point == "level:warn" and warn.threshold == model.thresholds["warn"]
    assert model.meta["test_recall_at_warn"] == warn.events.recall
    # the learned baselines were tuned on the validation runs, not on the test runs
    assert report.result("attn_logit").fitted_on == "validation"
    assert report.result("config_only").fitted_on == "validation"


class _ScoresByRun:
    """Stands in for the model's scoring only: set_levels' aggregation is under test."""

    horizon = 200

    def __init__(self, scores: dict[str, np.ndarray]) -> None:
        self.scores, self.meta, self.thresholds = scores, {}, None

    def predict_run(self, frame, steps):
        return pd.Series(self.scores[frame.attrs["run_id"]])

    def with_thresholds(self, thresholds):
        self.thresholds = thresholds
        return self


def _healthy(run_id: str, source: str, n: int) -> RunRecord:
    frame = pd.DataFrame({"step": np.arange(n)})
    frame.attrs["run_id"] = run_id
    return RunRecord(frame, RunMeta(run_id=run_id, source=source))


def test_each_source_holds_its_budget_so_the_level_is_the_highest_per_source_threshold():
    # synthetic healthy scores lower than real ones, as measured on the bundled model's
    # data: pooled, the 20,000 synthetic steps set watch at 0.39, which the real runs
    # (scores 0.2-0.6) cross far more often than once per 10 steps; per source, the real
    # runs set every level (0.553 / 0.596 / 0.599) and the synthetic ones hold it too
    rng = np.random.default_rng(0)
    synthetic, real = rng.uniform(0.0, 0.4, 20_000), rng.uniform(0.2, 0.6, 10_000)
    budgets = {"watch": 10, "warn": 100, "critical": 1000}
    model = _ScoresByRun({"s": synthetic, "r": real})
    runs = [_healthy("s", "synthetic", synthetic.size), _healthy("r", "real", real.size)]
    set_levels(model, runs, budgets)
    pooled = thresholds_from_budgets([synthetic, real], budgets)
    assert model.thresholds == thresholds_from_budgets([real], budgets)
    assert model.thresholds["watch"] == pytest.approx(0.5527, abs=1e-4)
    assert pooled["watch"] == pytest.approx(0.3904, abs=1e-4)
    assert model.meta["threshold_sources"] == ["real", "synthetic"]
    assert model.meta["threshold_healthy_steps"] == 30_000


def test_a_collapsing_runs_steps_before_onset_minus_h_are_healthy_steps_for_the_levels():
    # as the evaluation counts false alarms: an alarm 300 steps before onset is false,
    # one 100 steps before is a catch. Three high steps of each kind in a collapsing run
    rng = np.random.default_rng(1)
    healthy = rng.uniform(0.0, 0.3, 5_000)
    collapsing = rng.uniform(0.0, 0.3, 1_000)
    collapsing[[100, 300, 500]] = 0.9  # before onset - H (800 - 200): count
    collapsing[[650, 700, 750]] = 0.95  # in the horizon: do not
    collapsing[850:] = 1.0  # after onset: nothing
    model = _ScoresByRun({"h": healthy, "c": collapsing})
    c = _healthy("c", "real", collapsing.size)
    c = RunRecord(c.frame, dataclasses.replace(c.meta, onset_step=800))
    budgets = {"watch": 10, "warn": 100, "critical": 1000}
    set_levels(model, [_healthy("h", "real", healthy.size), c], budgets)
    counted = [healthy, collapsing[:600]]
    assert model.thresholds == thresholds_from_budgets(counted, budgets)
    assert model.meta["threshold_healthy_steps"] == 5_600
    # 3 episodes in 5,600 healthy steps are within critical's budget of one per 1,000
    # steps at 0.9, and none come from the horizon's 0.95 or the collapse's 1.0
    assert model.thresholds["critical"] <= 0.9


def test_synthetic_runs_alone_set_the_levels_on_validation_runs_and_say_why(trained):
    model, _ = trained  # synthetic runs have no model family to leave out
    assert model.meta["levels_from"] == {
        "runs": "validation",
        "not_cross_fitted": "0 family value(s) among the runs (synthetic runs have none); "
        "cross-fitting needs at least two",
    }


def test_the_row_stride_grows_only_past_the_row_budget():
    from collapse_guard.predictor.training.train import MAX_TRAIN_ROWS, row_stride

    runs = [_healthy(f"r{n}", "synthetic", n) for n in (1000, 500)]
    # stride 10: 100 + 50 = 150 rows; within 100 rows: ceil(1000/16) + ceil(500/16) = 95,
    # where stride 15 gives 67 + 34 = 101
    assert row_stride(runs, 10, 200, max_rows=150) == 10
    assert row_stride(runs, 10, 200, max_rows=100) == 16
    # the default budget: 10,000 synthetic runs of ~2,100 steps (6,000 train runs) train
    # at stride 26, 6,000 x 81 = 486k rows (stride 25: 504k), where stride 10 gave 1.26M
    fleet = [_healthy("r", "synthetic", 2100)] * 6000
    assert MAX_TRAIN_ROWS == 500_000 and row_stride(fleet, 10, 200) == 26


def test_training_says_each_stage_and_counts_the_runs_it_reads(synthetic_paths, capsys):
    lines: list[str] = []
    kwargs = {"seed": 5, "stride": 25, "params": {"n_estimators": 15, "min_child_samples": 20}}
    train_risk_model(synthetic_paths[:30], progress=lines.append, levels_by=None, **kwargs)
    said = " | ".join(lines)
    for stage in ("split:", "fitting LightGBM on", "fitted", "baselines", "evaluating on"):
        assert stage in said, said
    bars = capsys.readouterr().out  # rich's bar, as drawn off a terminal: its last state
    assert "features: train runs" in bars and "features: validation runs" in bars


def test_runs_warmed_up_from_lr_zero_train(synthetic_paths, tmp_path):
    # the transformers Trainer's warm-up starts at LR 0: `train` on its guarded run files
    # died in the config-only baseline with "Input X contains infinity"
    from collapse_guard.runfiles import read_run, write_run

    paths = []
    for path in synthetic_paths[:30]:
        frame, meta = read_run(path)
        frame.loc[frame.index[:3], "lr"] = [0.0, 0.0, -0.0]
        paths.append(write_run(tmp_path / path.name, frame, meta))
    kwargs = {"seed": 5, "stride": 25, "params": {"n_estimators": 15, "min_child_samples": 20}}
    result = train_risk_model(paths, levels_by=None, **kwargs)
    assert "config_only" in result.report.to_frame()["scorer"].tolist()
    assert result.model.meta["n_trees"] >= 1


def test_one_frozen_config_is_what_the_training_ran_and_what_the_model_records(training):
    from predictor_settings import FAST_PARAMS

    from collapse_guard.predictor.training.config import TrainConfig

    config = training.config
    assert config == TrainConfig(seed=0, stride=10, params=FAST_PARAMS)
    assert training.model.meta["train_config"] == config.to_dict()
    assert TrainConfig(**training.model.meta["train_config"]) == config  # read back whole
    # a setting this code no longer knows is dropped, one it added since takes its default
    recorded = {**config.to_dict(), "gone": 1}
    del recorded["healthy_rise_weight"]
    assert TrainConfig.from_dict(recorded) == config
    assert training.model.hold_steps == config.hold_steps == 50
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 1
    with pytest.raises(TypeError, match=r"unknown training setting\(s\) \['hold'\]"):
        config.replace(hold=3)
    with pytest.raises(UserInputError, match="stride must be at least 1 step; got 0"):
        TrainConfig(stride=0)
    assert config.positives_within is None  # every row of the horizon
    with pytest.raises(UserInputError, match=r"positives_within must be 1 to the horizon \(200\)"):
        TrainConfig(positives_within=201)
    assert config.healthy_rise_weight == 1.0  # every row weighs the same
    for weight in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(UserInputError, match="healthy_rise_weight must be a positive finite"):
            TrainConfig(healthy_rise_weight=weight)
    with pytest.raises(UserInputError, match="calibration must be one of platt, isotonic"):
        TrainConfig(calibration="beta")
    budgets = {"watch": 10, "warn": 100, "critical": 1000}
    mine = TrainConfig(budgets=budgets)
    budgets["warn"] = 1  # the caller's dict changed later changes no config
    assert mine.budgets["warn"] == 100 and TrainConfig.of(mine, seed=2).budgets["warn"] == 100


def test_the_fit_trains_a_collapse_on_its_rows_near_the_onset_when_asked(run_records):
    from predictor_settings import FAST_PARAMS

    from collapse_guard.features import FeatureExtractor
    from collapse_guard.predictor.training.config import TrainConfig
    from collapse_guard.predictor.training.data import build_training_data, near_positives
    from collapse_guard.predictor.training.train import fit_risk_model

    split = split_runs([r.meta for r in run_records], seed=0)
    train = [r for r in run_records if r.run_id in split.train]
    val = [r for r in run_records if r.run_id in split.validation]
    config = TrainConfig(stride=10, params=FAST_PARAMS, positives_within=60)
    model, _ = fit_risk_model(train, val, config)
    rows = build_training_data(train, FeatureExtractor(), stride=10)
    near = near_positives(rows, train, 60)
    assert model.meta["train_positive_rows"] == near.y.sum() < rows.y.sum() * 0.4
    assert (
        model.meta["train_rows"] == len(near)
        and model.meta["train_config"]["positives_within"] == 60
    )


def test_healthy_rows_inside_a_rise_weighed_more_get_less_risk(run_records):
    from predictor_settings import FAST_PARAMS

    from collapse_guard.features import FeatureExtractor
    from collapse_guard.predictor.training.config import TrainConfig
    from collapse_guard.predictor.training.data import build_training_data
    from collapse_guard.predictor.training.train import fit_risk_model

    split = split_runs([r.meta for r in run_records], seed=0)
    train = [r for r in run_records if r.run_id in split.train]
    val = [r for r in run_records if r.run_id in split.validation]
    rows = build_training_data(train, FeatureExtractor(signals=TrainConfig().signals), stride=10)
    hard = (rows.y == 0) & rows.in_rise

    def mean_risk(weight):
        config = TrainConfig(stride=10, params=FAST_PARAMS, healthy_rise_weight=weight)
        model, predictor = fit_risk_model(train, val, config)
        assert model.meta["train_config"]["healthy_rise_weight"] == weight
        return predictor.raw_proba(rows.X)[hard].mean()

    plain, weighed = mean_risk(1.0), mean_risk(6.0)
    assert hard.sum() > 100 and weighed < 0.6 * plain, (plain, weighed)
