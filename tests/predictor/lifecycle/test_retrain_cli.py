"""The retrain command as a user meets it: runs from an fsspec URL, every skipped file named,
bad input one line and exit code 2; and --dask through the same training function."""

from __future__ import annotations

import fsspec
import pytest
import typer
from predictor_settings import LIFECYCLE_TRAINING
from typer.testing import CliRunner

from collapse_guard.cli import ErrorHandlingGroup
from collapse_guard.predictor.cli.retrain import retrain
from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.lifecycle import registry
from collapse_guard.predictor.lifecycle.retrain import retrain as run_retrain


@pytest.fixture
def app():
    """``collapse-guard``'s error handling around the one command (as the lead mounts it)."""
    cli = typer.Typer(cls=ErrorHandlingGroup)

    @cli.callback()
    def main() -> None:
        """Test app."""

    cli.command(name="retrain")(retrain)
    return cli


@pytest.fixture
def fleet_url(new_paths):
    fs = fsspec.filesystem("memory")
    for path in new_paths[:6]:
        fs.put(str(path), f"memory://cli-fleet/{path.name}")
    fs.pipe("memory://cli-fleet/broken.parquet", b"PAR1 cut short")
    yield "memory://cli-fleet"
    fs.rm("memory://cli-fleet", recursive=True)


def test_bad_input_is_one_line_and_exit_code_2(app, tmp_path, store, base):
    runner = CliRunner()
    missing = [str(tmp_path / "no-such-folder"), str(tmp_path / "nor-this")]
    result = runner.invoke(app, ["retrain", "--runs", *missing, "--base", str(base)])
    assert result.exit_code == 2, result.output
    assert "error: no run file could be ingested" in result.output
    assert all(m in result.output for m in missing) and "Traceback" not in result.output
    uri = f"sqlite:///{tmp_path}/absent/mlflow.db"
    result = runner.invoke(app, ["retrain", "--runs", str(base), "--tracking-uri", uri])
    assert result.exit_code == 2 and "does not exist" in result.output


@pytest.mark.slow  # ~25 s: a training with the default LightGBM settings
def test_command_ingests_from_a_url_names_what_it_skipped_and_promotes(app, store, base, fleet_url):
    args = ["retrain", "--runs", fleet_url, "--base", str(base), "--tracking-uri", store]
    result = CliRunner().invoke(app, [*args, "--no-recalibrate"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "skipped memory:///cli-fleet/broken.parquet: " in " ".join(result.output.split())
    assert "v1 is now champion" in result.output
    assert registry.champion_version() == "1"
    # --no-recalibrate: the levels of its validation runs, none set on the new runs
    champion = RiskModel.load(f"models:/{registry.MODEL_NAME}/1")
    assert "calibrated_on" not in champion.meta
    assert champion.meta["levels_from"].get("by") != "calibrate"
    assert len(list((base / "ingested").glob("*.parquet"))) == 6


@pytest.mark.slow  # ~40 s: two trainings and a Dask cluster
def test_dask_goes_through_the_same_training(store, base):
    from distributed import Client, LocalCluster, get_task_stream

    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
        get_task_stream(client) as tasks,
    ):
        on_dask = run_retrain([], base=base, dask=cluster.scheduler_address, **LIFECYCLE_TRAINING)
    assert any("chunk_rows" in str(t["key"]) for t in tasks.data)
    # the same retrain without Dask, in another experiment and registered model of the store
    local = run_retrain([], base=base, experiment="local", model_name="local", **LIFECYCLE_TRAINING)
    assert on_dask.benchmark.run_ids == local.benchmark.run_ids
    remote_model = RiskModel.load(f"models:/{registry.MODEL_NAME}/{on_dask.version}")
    local_model = RiskModel.load(f"models:/local/{local.version}")
    assert remote_model.booster.model_to_string() == local_model.booster.model_to_string()


def test_retrain_takes_the_training_options_train_takes(app, tmp_path, monkeypatch):
    """--seed, --stride, --hold-steps, --positives-within and --healthy-rise-weight reach
    retrain as settings (train's surface), the flags left out absent: those the champion's
    own training gives."""
    import collapse_guard.predictor.lifecycle.retrain as lifecycle_retrain
    from collapse_guard.errors import UserInputError

    seen = []

    def capture(runs, **kwargs):
        seen.append(kwargs)
        raise UserInputError("captured")

    monkeypatch.setattr(lifecycle_retrain, "retrain", capture)
    args = ["retrain", "--runs", str(tmp_path), "--base", str(tmp_path / "base")]
    flags = ["--seed", "5", "--stride", "20", "--hold-steps", "0", "--positives-within", "120"]
    result = CliRunner().invoke(app, [*args, *flags, "--healthy-rise-weight", "4"])
    assert result.exit_code == 2 and "captured" in result.output, result.output
    given = {k: seen[0][k] for k in ("seed", "stride", "hold_steps", "positives_within")}
    assert given == {"seed": 5, "stride": 20, "hold_steps": 0, "positives_within": 120}
    assert seen[0]["healthy_rise_weight"] == 4.0 and "config" not in seen[0]
    CliRunner().invoke(app, [*args, "--positives-within", "0"])
    assert seen[1]["positives_within"] is None  # 0: every row, over the champion's own
    assert not {"stride", "hold_steps", "healthy_rise_weight"} & set(seen[1])  # left out
    bad = CliRunner().invoke(app, ["retrain", "--runs", str(tmp_path), "--hold-steps", "-2"])
    assert bad.exit_code == 2 and "--hold-steps must be 0 or more steps" in bad.output
