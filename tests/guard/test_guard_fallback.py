"""The fallback keeps the model (issue 33): when the service fails, the guard scores with
the model named with it, and its warning and ``summary()`` name the version in use; the
bundled model in its place is said loudly, with both versions and both levels. And
``Guard(risk=...)``'s errors speak of ``risk=``, not of the command line's ``--model``.

The calibrated model is the bundled one with its levels set low (as ``calibrate`` sets
them on a user's runs): the same probabilities, other levels, so the level the guard acts
on tells the two apart. The tiny run's risk is 0.015-0.09 (seed 0; 0.015-0.017 from step
50, with attention measured every 5 steps at ``warn``): ``warn`` by the calibrated levels
(0.005), ``ok`` by the bundled ones (0.80).
"""

from __future__ import annotations

import os
import time
import warnings

import pytest
from guard_helpers import Loop, tiny_model
from support import free_port, serve_process, wait_ready

from collapse_guard.errors import UserInputError
from collapse_guard.guard import Guard, ServiceRisk
from collapse_guard.guard.risk_source import model_version
from collapse_guard.runfiles import read_run
from collapse_guard.service.client import RiskClient

CALIBRATED = {"watch": 0.002, "warn": 0.005, "critical": 0.7}  # the bundled: 0.42, 0.80, 0.92
HOLD_STEPS = 50  # the bundled model's hold: past it, the held risk is the fallback's alone


@pytest.fixture(scope="module")
def calibrated_dir(tmp_path_factory, risk_model):
    """The bundled model with the CALIBRATED levels, labelled ``my-cal`` (served as
    ``my-cal+<its digest>``: the label names no content)."""
    from collapse_guard.predictor.core.risk import RiskModel

    m = risk_model
    meta = {k: v for k, v in m.meta.items() if k != "source"} | {"version": "my-cal"}
    calibrated = RiskModel(
        m.booster, m.schema, m.calibrator, CALIBRATED, horizon=m.horizon,
        budgets=m.budgets, hold_steps=m.hold_steps, meta=meta,
    )  # fmt: skip
    return calibrated.save(tmp_path_factory.mktemp("calibrated") / "my-cal")


def _step(guard: Guard, model, opt, loop: Loop) -> None:
    guard.step(loop.loss(model))
    opt.zero_grad()


class _Run:
    """One guarded tiny run, stepped by the test."""

    def __init__(self, folder, risk) -> None:
        self.model, self.opt = tiny_model()
        self.guard = Guard(self.model, self.opt, folder, risk=risk, policy={"risk_every": 5})
        self.loop = Loop()

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            _step(self.guard, self.model, self.opt, self.loop)

    def until(self, source: str, limit: float = 60.0) -> None:
        """Step until a reading of ``source`` is in force (the service answers from a
        thread: a step now and then, with a pause, until it has)."""
        deadline = time.monotonic() + limit
        while self.guard.risk_source != source:
            assert time.monotonic() < deadline, f"no {source} reading in {limit} s"
            self.step()
            time.sleep(0.02)


def _said(caught) -> list[str]:
    return [str(w.message) for w in caught if "risk service failed" in str(w.message)]


# --------------------------------------------------------------------- messages
def test_a_risk_path_that_does_not_exist_says_so_and_what_risk_takes(tmp_path):
    model, opt = tiny_model()
    with pytest.raises(UserInputError) as caught:
        Guard(model, opt, tmp_path, risk="models/my-setp")
    text = str(caught.value)
    assert text.startswith("risk='models/my-setp': no such model folder")
    assert f"{os.getcwd()}/models/my-setp does not exist" in text
    assert "risk= takes None or 'embedded'" in text and "ServiceRisk(url, fallback=" in text
    assert "--model" not in text


def test_a_folder_that_is_no_model_names_risk_not_the_cli_flag(tmp_path):
    (tmp_path / "notmodel").mkdir()
    model, opt = tiny_model()
    with pytest.raises(UserInputError) as caught:
        Guard(model, opt, tmp_path / "ckpt", risk=str(tmp_path / "notmodel"))
    text = str(caught.value)
    assert text.startswith(f"risk={str(tmp_path / 'notmodel')!r}: ")
    assert "is not a model folder: expected risk_model.json and model.txt" in text
    assert "--model" not in text and "risk= takes" in text


def test_a_fallback_that_does_not_exist_is_refused_before_training(tmp_path):
    model, opt = tiny_model()
    risk = ServiceRisk(f"http://127.0.0.1:{free_port()}", fallback="models/my-setp")
    with pytest.raises(UserInputError, match=r"^ServiceRisk\(fallback=\.\.\.\)='models/my-setp'"):
        Guard(model, opt, tmp_path, risk=risk)


# ---------------------------------------------------- fallback without a service
def test_a_folder_is_embedded_and_named_by_the_version_the_service_gives_it(
    tmp_path, calibrated_dir
):
    run = _Run(tmp_path, str(calibrated_dir))
    run.step(10)
    run.guard.close()
    summary = run.guard.summary()
    assert summary["risk_source"] == "embedded"
    assert summary["risk_model_version"] == model_version(run.guard.risk.model)
    assert summary["risk_model_version"].startswith("my-cal+")  # the label names no content


def test_a_service_never_reached_says_the_bundled_model_stands_in_for_an_unknown_one(
    tmp_path, risk_model
):
    url = f"http://127.0.0.1:{free_port()}"
    run = _Run(tmp_path, ServiceRisk(url, timeout=0.5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.until("fallback")
        run.guard.close()
    bundled = model_version(risk_model)
    said = _said(caught)
    assert len(said) == 1
    assert f"scoring with the bundled model, version {bundled!r} (the service never " in said[0]
    assert "so its model is unknown; to keep the served model and its levels, name it " in said[0]
    assert "ServiceRisk(url, fallback=MODEL_FOLDER)" in said[0]
    assert run.guard.summary()["risk_model_version"] == bundled


# ------------------------------------------------- the loop: serve, guard, kill
@pytest.mark.slow
def test_after_the_server_dies_the_named_fallback_keeps_the_served_model(
    tmp_path, risk_model, calibrated_dir
):
    env = {k: v for k, v in os.environ.items() if k != "COLLAPSE_GUARD_TOKEN"}
    env |= {"BENTOML_HOME": str(tmp_path / "bentoml"), "BENTOML_DO_NOT_TRACK": "true"}
    args = ["--model", str(calibrated_dir), "--workers", "1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with serve_process(tmp_path, args, env) as (url, proc, log):
            wait_ready(url, proc, log)
            with RiskClient(url) as client:
                served = client.model_info().version
            named = _Run(tmp_path / "named", ServiceRisk(url, fallback=str(calibrated_dir)))
            bundled = _Run(tmp_path / "bundled", url)
            for run in (named, bundled):
                run.until("service")
                assert run.guard.summary()["risk_model_version"] == served
        # the server is gone (SIGTERM to its process group), mid-run
        for run in (named, bundled):
            run.until("fallback")
            run.step(HOLD_STEPS + 10)  # the held risk is now the fallback's alone
            run.guard.close()
    said = _said(caught)
    assert len(said) == 2, said

    # the model named with the guard is the served one: its version and its levels
    assert served == model_version(named.guard.risk.fallback.model) != model_version(risk_model)
    summary = named.guard.summary()
    assert summary["risk_source"] == "fallback" and summary["risk_model_version"] == served
    meta = read_run(named.guard.run_path)[1]
    assert meta.extra["guard"]["risk_model_version"] == served
    p = named.guard.probability
    assert risk_model.level(p) == "ok"  # by the bundled levels the run would be quiet
    assert named.guard.level == "warn" == named.guard.risk.fallback.model.level(p)
    keeps = [m for m in said if f"the model named with the guard, version {served!r}" in m]
    assert len(keeps) == 1 and "the model the service was serving" in keeps[0]

    # the bundled model in its place: said loudly, with both versions and both warn levels
    version = model_version(risk_model)
    summary = bundled.guard.summary()
    assert summary["risk_source"] == "fallback" and summary["risk_model_version"] == version
    assert bundled.guard.level == "ok" == risk_model.level(bundled.guard.probability)
    instead = next(m for m in said if m not in keeps)
    warn = risk_model.thresholds["warn"]
    assert (
        f"the bundled model, version {version!r}, NOT the served model {served!r}: its "
        f"levels differ (warn at p >= {warn:.3g}, the served model's at 0.005)" in instead
    )
    assert "name it with the guard: ServiceRisk(url, fallback=MODEL_FOLDER)" in instead
