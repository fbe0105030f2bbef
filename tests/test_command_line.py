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


def test_demo_prints_finite_losses():
    result = CliRunner().invoke(app, ["demo", "--steps", "20", "--every", "5"])
    assert result.exit_code == 0, result.output
    # table rows: cells between box bars (ASCII "|" where the terminal has no Unicode)
    cells = [
        [c.strip() for c in re.split(r"[│┃|]", line.strip())[1:-1]]
        for line in result.output.splitlines()
    ]
    data = [c for c in cells if c and c[0].isdigit()]  # the header row starts with "step"
    assert [int(c[0]) for c in data] == [0, 5, 10, 15, 19]
    losses = [float(c[1]) for c in data]  # the loss column follows the step
    assert all(math.isfinite(x) for x in losses), losses
    risks = [float(c[-2]) for c in data]  # the bundled model's risk, then its level
    assert all(0.0 <= p <= 1.0 for p in risks), risks
    assert {c[-1] for c in data} <= {"ok", "watch", "warn", "critical"}
    assert "20 steps in" in result.output and "Label: no collapse" in result.output
