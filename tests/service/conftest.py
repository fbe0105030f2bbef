"""Service fixtures: the bundled model, model variants, an in-process app, a served instance.

The served instance is real: ``collapse-guard serve`` (which execs ``bentoml serve``) as a
subprocess in its own process group on a free loopback port, 2 workers, a bearer token,
BENTOML_HOME in a temporary folder, a small body limit; SIGTERM to the group at the end.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before lightgbm (docs/stack.md, "OpenMP")
os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")

import shutil

import pytest
from helpers import TOKEN
from service_settings import SERVED_BODY_LIMIT, SERVED_IDLE_SECONDS, VARIANT_VERSION
from support import serve_process, wait_ready


@pytest.fixture(scope="session")
def default_model():
    from collapse_guard.predictor.core.risk import RiskModel

    return RiskModel.load()


@pytest.fixture(scope="session")
def variant_dir(tmp_path_factory, default_model):
    """The bundled model cut to its first 40 trees: a real, different LightGBM model."""
    import lightgbm as lgb

    from collapse_guard.predictor.core.risk import RiskModel

    m = default_model
    booster = lgb.Booster(model_str=m.booster.model_to_string(num_iteration=40))
    meta = {k: v for k, v in m.meta.items() if k not in ("source",)} | {"version": VARIANT_VERSION}
    variant = RiskModel(
        booster,
        m.schema,
        m.calibrator,
        m.thresholds,
        horizon=m.horizon,
        budgets=m.budgets,
        hold_steps=m.hold_steps,
        meta=meta,
    )
    return variant.save(tmp_path_factory.mktemp("variant") / "model")


@pytest.fixture(scope="session")
def broken_dir(tmp_path_factory, variant_dir):
    """A model folder whose booster file is damaged: loading it must fail."""
    folder = tmp_path_factory.mktemp("broken") / "model"
    shutil.copytree(variant_dir, folder)
    (folder / "model.txt").write_text("tree\nnot a lightgbm model\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def nan_dir(tmp_path_factory, variant_dir):
    """A model folder that loads but answers NaN (its calibration's slope is NaN)."""
    import json

    folder = tmp_path_factory.mktemp("nan") / "model"
    shutil.copytree(variant_dir, folder)
    spec_path = folder / "risk_model.json"
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    spec["calibration"]["params"]["a"] = float("nan")
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def store_uri(tmp_path_factory):
    """Where the test MLflow store lives (filled by ``mlflow_uri``)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="session")
def mlflow_uri(store_uri, variant_dir):
    """A real SQLite MLflow store holding the variant as collapse-predictor v1 @champion."""
    import mlflow

    from collapse_guard.predictor.core.risk import RiskModel
    from collapse_guard.predictor.lifecycle import registry

    uri = store_uri
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        mlflow.MlflowClient(tracking_uri=uri).search_experiments()  # migrations, once
        registry.log_training(
            RiskModel.load(variant_dir),
            metrics={},
            params={"test": 1},
            fingerprint="service-test",
        )
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI")
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old
    return uri


@pytest.fixture(scope="session")
def app_client(tmp_path_factory):
    """The service's ASGI app in process (starlette TestClient), no token, default model."""
    from starlette.testclient import TestClient

    from collapse_guard.service.server.risk_service import RiskService

    reload_file = tmp_path_factory.mktemp("inproc") / "reload.json"
    saved = {k: os.environ.get(k) for k in ("COLLAPSE_GUARD_TOKEN", "COLLAPSE_GUARD_RELOAD_FILE")}
    os.environ.pop("COLLAPSE_GUARD_TOKEN", None)
    os.environ["COLLAPSE_GUARD_RELOAD_FILE"] = str(reload_file)
    try:
        with TestClient(RiskService.to_asgi()) as client:
            yield client
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def served_server(tmp_path_factory, store_uri, request):
    """A real served instance: `collapse-guard serve --workers 2`, token TOKEN, a 4 MB
    body limit, a 2 s body stall limit. Yields (url, the server's process)."""
    folder = tmp_path_factory.mktemp("served")
    env = dict(os.environ)
    env.update(
        BENTOML_HOME=str(folder / "bentoml"),
        COLLAPSE_GUARD_TOKEN=TOKEN,
        COLLAPSE_GUARD_MAX_BODY_BYTES=str(SERVED_BODY_LIMIT),
        COLLAPSE_GUARD_BODY_IDLE_SECONDS=str(SERVED_IDLE_SECONDS),
        MLFLOW_TRACKING_URI=store_uri,
    )
    args = ["--workers", "2", "--model", "default"]
    with serve_process(folder, args, env) as (url, proc, log):
        request.getfixturevalue("mlflow_uri")  # fill the store while the server starts
        wait_ready(url, proc, log)
        yield url, proc


@pytest.fixture(scope="session")
def served(served_server):
    """URL of the served instance (served_server)."""
    return served_server[0]
