"""Models and a served instance for the lifecycle tests (a module name no other folder has)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from lifecycle_settings import BUDGETS, FAST_PARAMS
from support import free_port, wait_ready

from collapse_guard.datasets.runfile import list_runs
from collapse_guard.predictor import registry
from collapse_guard.predictor.levels import LEVELS
from collapse_guard.predictor.risk import RiskModel
from collapse_guard.predictor.train import train_risk_model

__all__ = ["never_warning_champion", "served"]


def never_warning_champion(base: Path) -> RiskModel:
    """Register, as the first champion, a model trained on the dataset whose levels are
    set at P = 1: it never warns, so it catches nothing (recall 0 on any run)."""
    result = train_risk_model(list_runs(base), seed=0, params=FAST_PARAMS, budgets=BUDGETS)
    model = result.model.with_thresholds(dict.fromkeys(LEVELS, 1.0))
    record = registry.log_training(model, params={"test": "never warns"}, fingerprint="t")
    assert record.version == "1" and registry.champion_version() == "1"
    return model


@contextmanager
def served(folder: Path, *args: str):
    """URL of `collapse-guard serve ARGS` on a free loopback port (its own process group,
    BENTOML_HOME in ``folder``, no token); SIGTERM to the group at the end."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "COLLAPSE_GUARD_TOKEN"}
    env["BENTOML_HOME"] = str(folder / "bentoml")
    command = Path(sys.executable).with_name("collapse-guard")
    log = folder / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(command), "serve", "--port", str(port), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
