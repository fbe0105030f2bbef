"""``collapse-guard train | evaluate | predict`` through the real ``collapse-guard`` app
(``collapse_guard.cli.app``: a ``UserInputError`` is one line and exit code 2), with a real
SQLite MLflow store.

Training itself is ``train_risk_model``'s business (tested by the predictor-core tests);
here it is replaced by the session's one cached training, so that these tests check the
command's own work: run discovery, MLflow logging and plots, promotion, tables, plots.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from ops_fixtures import mlflow_store, synthetic_run_paths, trained, training
from typer.testing import CliRunner

from collapse_guard.cli import app
from collapse_guard.errors import UserInputError

runner = CliRunner()


@pytest.fixture
def runs_dir(tmp_path_factory):
    return synthetic_run_paths(tmp_path_factory.getbasetemp())[0].parent


@pytest.fixture
def cached_training(tmp_path_factory, monkeypatch):
    """Make ``train_risk_model`` return the session's training; record how it was called."""
    import collapse_guard.predictor.training.train as train_module

    result = training(tmp_path_factory.getbasetemp())
    calls = []

    def fake(paths, config=None, **kwargs):
        calls.append({"paths": list(paths), "config": config, **kwargs})
        return result

    monkeypatch.setattr(train_module, "train_risk_model", fake)
    return calls


def test_importing_the_commands_stays_light():
    code = (
        "import sys, collapse_guard.predictor.cli.commands; "
        "heavy = {'mlflow', 'lightgbm', 'dask', 'pandas', 'matplotlib'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_runs_says_how_to_make_some(tmp_path):
    result = runner.invoke(app, ["evaluate", "--runs", str(tmp_path)])
    assert result.exit_code == 2
    assert "no runs found under" in result.output
    assert "collapse-guard data synth" in result.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--budget", "0"], "--budget must be a positive number"),
        (["--leave-one-out", "colour"], "--leave-one-out must be one of"),
        (["--leave-one-out", "family", "--hold-steps", "-1"], "--hold-steps must be 0 or more"),
        (["--leave-one-out", "family", "--stride", "0"], "--stride must be 1 or more"),
        (["--leave-one-out", "family", "--positives-within", "-1"], "--positives-within must"),
        (["--leave-one-out", "family", "--positives-within", "201"], "to the horizon (200)"),
    ],
)
def test_the_commands_own_checks_raise_user_input_errors(tmp_path, runs_dir, args, words):
    """Raised, not printed: the app makes them one line (and --debug shows where from)."""
    result = runner.invoke(app, ["--debug", "evaluate", "--runs", str(runs_dir), *args])
    assert isinstance(result.exception, UserInputError), result.output
    assert words in str(result.exception)
    plain = runner.invoke(app, ["evaluate", "--runs", str(runs_dir), *args])
    assert plain.exit_code == 2 and "Traceback" not in plain.output


def test_train_logs_registers_and_promotes(
    runs_dir, cached_training, tmp_path_factory, monkeypatch
):
    import mlflow

    uri = mlflow_store(tmp_path_factory.getbasetemp())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    result = runner.invoke(app, ["train", "--runs", str(runs_dir), "--experiment", "cli-train"])
    assert result.exit_code == 0, result.output
    assert "now champion" in result.output
    assert len(cached_training[0]["paths"]) == len(list(runs_dir.glob("*.parquet")))
    assert "rows" not in cached_training[0]
    config = cached_training[0]["config"]
    assert config.hold_steps == 50 and config.stride == 10  # the training's own defaults

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("cli-train")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["dataset_fingerprint"]
    _, report, _ = trained(tmp_path_factory.getbasetemp())
    # the headline (the stored warn level) and the ROC-like row, as the report has them
    warn = report.result("model")
    assert run.data.metrics["model/all/level_warn/recall"] == warn.events.recall
    assert run.data.metrics["model/all/level_warn/fa_per_10k"] == warn.events.fa_per_10k
    assert (
        run.data.metrics["model/all/budget/recall"]
        == report.result("model", operating_point="budget").events.recall
    )
    assert any(k.startswith("dsi/") for k in run.data.metrics), "baselines logged beside"
    assert run.data.params["split.test"]
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    for name in (
        "pr_curve.png",
        "reliability.png",
        "lead_times.png",
        "feature_importance.png",
        "baselines.png",
        "evaluation.csv",
        "evaluation.json",
    ):
        assert f"plots/{name}" in plots
    folder = {a.path for a in client.list_artifacts(run.info.run_id, "risk_model")}
    assert {"risk_model/model.txt", "risk_model/risk_model.json"} <= folder

    again = runner.invoke(app, ["train", "--runs", str(runs_dir), "--experiment", "cli-train"])
    assert again.exit_code == 0, again.output
    assert "champion stays" in again.output, "an equal model must not take the alias"


def test_train_with_dask_hands_a_cluster_row_builder_to_the_pipeline(
    runs_dir, cached_training, tmp_path_factory, monkeypatch
):
    from contextlib import contextmanager

    import collapse_guard.predictor.training.fleet as fleet

    @contextmanager
    def no_cluster(scheduler):
        yield f"client for {scheduler}"

    monkeypatch.setattr(fleet, "fleet_client", no_cluster)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_store(tmp_path_factory.getbasetemp()))
    args = ["train", "--runs", str(runs_dir), "--dask", "local", "--no-register"]
    args += ["--hold-steps", "20", "--stride", "25", "--seed", "4", "--positives-within", "80"]
    args += ["--healthy-rise-weight", "2.5"]
    result = runner.invoke(app, [*args, "--experiment", "cli-dask"])
    assert result.exit_code == 0, result.output
    rows = cached_training[0]["rows"]
    assert rows.func is fleet.cluster_rows and rows.keywords == {"client": "client for local"}
    config = cached_training[0]["config"]
    assert (config.hold_steps, config.stride, config.seed) == (20, 25, 4)
    assert config.positives_within == 80 and config.healthy_rise_weight == 2.5
    assert "not registered" in result.output


def test_predict_prints_levels_and_plots(runs_dir, tmp_path):
    from collapse_guard.runfiles import read_meta

    run = next(p for p in sorted(runs_dir.glob("*.parquet")) if read_meta(p).onset_step)
    plot = tmp_path / "risk.png"
    result = runner.invoke(app, ["predict", str(run), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    for word in ("watch", "warn", "critical", "onset", "peak risk"):
        assert word in result.output
    assert plot.stat().st_size > 20_000


def test_evaluate_prints_the_model_beside_baselines(runs_dir):
    runs = sorted(runs_dir.glob("*.parquet"))[:6]
    args = [a for p in runs for a in ("--runs", str(p))]
    result = runner.invoke(app, ["evaluate", *args])
    assert result.exit_code == 0, result.output
    for scorer in ("model", "dsi", "zclip", "olmo_zscore", "kill_spike"):
        assert scorer in result.output
    assert "unseen runs" in result.output and "ROC-like" in result.output


@pytest.fixture
def own_model(tmp_path, tmp_path_factory):
    """The session's model (trained on the ops runs), saved as a folder."""
    model, _, splits = trained(tmp_path_factory.getbasetemp())
    return str(model.save(tmp_path / "model")), splits


def test_evaluate_refuses_the_runs_the_model_trained_on(runs_dir, own_model):
    folder, splits = own_model
    result = runner.invoke(app, ["evaluate", "--runs", str(runs_dir), "--model", folder])
    assert result.exit_code == 2
    n_train, n_val = len(splits["train"]), len(splits["validation"])
    assert f"{n_train + n_val} of the {len(list(runs_dir.glob('*.parquet')))} runs" in result.output
    assert f"train ({n_train}) or validate ({n_val})" in result.output
    assert "Traceback" not in result.output


def test_evaluate_unseen_only_scores_the_test_split(runs_dir, own_model):
    folder, splits = own_model
    args = ["evaluate", "--runs", str(runs_dir), "--model", folder, "--unseen-only"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"on {len(splits['test'])} runs it never saw" in " ".join(result.output.split())
    # the learned baselines were fitted on the model's own training / validation runs
    assert "config_only" in result.output and "attn_logit" in result.output
    assert "NOT A TEST" not in result.output
    seen = runner.invoke(app, [*args[:-1], "--include-seen"])
    assert seen.exit_code == 0 and "NOT A TEST" in seen.output


def test_evaluate_refuses_runs_with_the_bundled_models_own_run_ids(tmp_path):
    """`data real --seed 0` makes runs with the ids of the bundled model's training runs
    again (short here): refused by id, whatever their length."""
    from collapse_guard.predictor.core.risk import RiskModel
    from collapse_guard.predictor.core.seen_runs import SeenRuns

    made = runner.invoke(
        app, ["data", "real", "--n", "3", "--steps", "60", "--seed", "0", "--out", str(tmp_path)]
    )
    assert made.exit_code == 0, made.output
    seen = SeenRuns.from_meta(RiskModel.load().meta)
    ids = [p.stem for p in tmp_path.glob("*.parquet")]
    assert len(ids) == 3 and any(seen.role_of(i) is not None for i in ids)
    result = runner.invoke(app, ["evaluate", "--runs", str(tmp_path)])
    assert result.exit_code == 2 and "were used to train" in result.output


def test_evaluate_bad_leave_one_out_is_one_line(runs_dir):
    result = runner.invoke(app, ["evaluate", "--runs", str(runs_dir), "--leave-one-out", "colour"])
    assert result.exit_code == 2
    assert "--leave-one-out must be one of family, optimizer, data" in result.output
    # the ops runs are all synthetic: nothing to hold out
    result = runner.invoke(app, ["evaluate", "--runs", str(runs_dir), "--leave-one-out", "family"])
    assert result.exit_code == 2 and "at least two family values" in result.output


def test_leave_one_out_hands_the_seed_and_the_hold_to_the_models_it_trains(runs_dir, monkeypatch):
    import collapse_guard.predictor.training.holdout as holdout

    calls = []

    def capture(records, config, **kwargs):  # the training itself is test_holdout's
        calls.append({"config": config, **kwargs})
        raise ValueError("captured")

    monkeypatch.setattr(holdout, "leave_one_group_out", capture)
    args = ["--leave-one-out", "family", "--seed", "3", "--hold-steps", "20", "--stride", "30"]
    result = runner.invoke(app, ["evaluate", "--runs", str(runs_dir), *args, "--budget", "2"])
    assert result.exit_code == 2 and "captured" in result.output
    config = calls[0]["config"]
    assert (config.seed, config.hold_steps, config.stride) == (3, 20, 30)
    assert config.eval_budget_per_10k == 2.0 and calls[0]["by"] == "family"
    assert config.positives_within is None  # the default: every row of the horizon
    runner.invoke(app, ["evaluate", "--runs", str(runs_dir), *args, "--positives-within", "0"])
    assert calls[1]["config"].positives_within is None  # 0: every row, as the default
    runner.invoke(app, ["evaluate", "--runs", str(runs_dir), *args, "--positives-within", "90"])
    assert calls[2]["config"].positives_within == 90
    assert calls[0]["config"].healthy_rise_weight == 1.0  # the default: an unweighted fit
    weighed = ["--positives-within", "100", "--healthy-rise-weight", "3"]
    runner.invoke(app, ["evaluate", "--runs", str(runs_dir), *args, *weighed])
    assert calls[3]["config"].healthy_rise_weight == 3.0  # the bundled model's training
    bad = runner.invoke(
        app, ["evaluate", "--runs", str(runs_dir), *args, "--healthy-rise-weight", "0"]
    )
    assert (
        bad.exit_code == 2
        and "--healthy-rise-weight must be a positive number; got 0" in bad.output
    )
    assert "Traceback" not in bad.output and len(calls) == 4


def test_evaluate_warns_when_the_model_stores_no_ids(runs_dir, own_model, tmp_path):
    from collapse_guard.predictor.core.risk import RiskModel

    folder, _ = own_model
    old = RiskModel.load(folder)
    for key in ("split", "train_run_ids", "validation_run_ids"):
        old.meta.pop(key)
    runs = sorted(runs_dir.glob("*.parquet"))[:6]
    args = [a for p in runs for a in ("--runs", str(p))]
    result = runner.invoke(app, ["evaluate", *args, "--model", str(old.save(tmp_path / "old"))])
    assert result.exit_code == 0, result.output
    assert "stores no training or validation run ids" in " ".join(result.output.split())
