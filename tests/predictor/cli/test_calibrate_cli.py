"""``collapse-guard calibrate --register --alias``: the output names the version and the
alias it points at, and the alias loads the calibrated model (a real SQLite store)."""

from __future__ import annotations

from typer.testing import CliRunner

from collapse_guard.cli import app
from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.runfiles import read_meta


def test_calibrate_register_alias_names_the_alias(store, fresh_paths, tmp_path):
    healthy = [str(p) for p in fresh_paths if read_meta(p).onset_step is None][:4]
    out = tmp_path / "mine"
    result = CliRunner().invoke(
        app,
        ["calibrate", "--runs", *healthy, "--out", str(out), "--register", "--alias", "my-setup"],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()  # MLflow's own lines among them
    assert (
        "registered as collapse-predictor version 1; alias 'my-setup' points at it "
        "(collapse-predictor@my-setup)"
    ) in lines
    loaded = RiskModel.load("models:/collapse-predictor@my-setup")
    written = RiskModel.load(out)
    assert loaded.thresholds == written.thresholds
    assert loaded.meta["base_version"] == written.meta["base_version"]
    # 4 runs certify no per-run target: every level says so, in one line each
    assert sum(line.startswith(("warn: not", "critical: not")) for line in lines) == 2
