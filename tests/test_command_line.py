"""The ``collapse-guard`` command: every sub-command mounted, a fast start, a working demo."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from collapse_guard.cli import app

# Heavy dependencies that only a command's own run may import (DESIGN.md: extras).
_HEAVY = ("torch", "mlflow", "lightgbm", "bentoml")


def _command() -> Path:
    # the console script installed beside this interpreter (.venv/bin/collapse-guard)
    return Path(sys.executable).with_name("collapse-guard")


def test_help_lists_every_command():
    result = subprocess.run(
        [str(_command()), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    for name in ("data", "train", "evaluate", "predict", "demo"):
        assert f" {name} " in result.stdout, f"{name!r} missing from:\n{result.stdout}"


def test_importing_the_cli_leaves_heavy_dependencies_out():
    code = (
        "import sys, collapse_guard.cli; "
        f"print(','.join(m for m in {_HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "", f"imported at start-up: {result.stdout.strip()}"


def test_demo_trains_both_runs_prints_the_table_and_writes_the_plot(tmp_path):
    args = ["demo", "--steps", "40", "--rewarm-at", "20", "--rewarm-steps", "10"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # table rows: cells between box bars (ASCII "|" where the terminal has no Unicode)
    cells = [
        [c.strip() for c in re.split(r"[│┃|]", line.strip())[1:-1]]
        for line in result.output.splitlines()
    ]
    rows = {c[0]: c for c in cells if c and c[0] in ("unguarded", "guarded")}
    assert set(rows) == {"unguarded", "guarded"}
    for row in rows.values():
        assert math.isfinite(float(row[1])) and float(row[1]) > 0  # final loss
        assert float(row[-1]) > 0  # wall seconds
    assert "checkpoint" in rows["guarded"][4]  # its first healthy step wrote one
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert len(list((tmp_path / "guarded").glob("run-*.parquet"))) == 1
