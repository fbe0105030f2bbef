"""Models and a served instance for the lifecycle tests (a module name no other folder has)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from predictor_settings import LIFECYCLE_BUDGETS, LIFECYCLE_PARAMS
from support import serve_process, wait_ready

from collapse_guard.predictor.core.levels import LEVELS
from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.lifecycle import registry
from collapse_guard.predictor.training.train import train_risk_model
from collapse_guard.runfiles import list_runs

__all__ = ["never_warning_champion", "served"]


def never_warning_champion(base: Path) -> RiskModel:
    """Register, as the first champion, a model trained on the dataset whose levels are
    set at P = 1: it never warns, so it catches nothing (recall 0 on any run)."""
    result = train_risk_model(
        list_runs(base), seed=0, params=LIFECYCLE_PARAMS, budgets=LIFECYCLE_BUDGETS
    )
    model = result.model.with_thresholds(dict.fromkeys(LEVELS, 1.0))
    record = registry.log_training(model, params={"test": "never warns"}, fingerprint="t")
    assert record.version == "1" and registry.champion_version() == "1"
    return model


@contextmanager
def served(folder: Path, *args: str):
    """URL of `collapse-guard serve ARGS` on a free loopback port (its own process group,
    BENTOML_HOME in ``folder``, no token); SIGTERM to the group at the end."""
    env = {k: v for k, v in os.environ.items() if k != "COLLAPSE_GUARD_TOKEN"}
    env["BENTOML_HOME"] = str(folder / "bentoml")
    with serve_process(folder, list(args), env) as (url, proc, log):
        wait_ready(url, proc, log)
        yield url
