"""A window whose latest measured loss or gradient norm is NaN/inf is a collapse now:
level critical with a reason, the probability still the forecast's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from documents import curl_body, section
from helpers import TOKEN, window

from collapse_guard.service import RiskClient
from collapse_guard.service.client.arrow_writer import ARROW_TYPE, encode_runs
from collapse_guard.service.client.raw_run import RawRun

_, README_BODY = curl_body(section("The risk service"))  # the README's own curl example


def risk(app_client, body: dict) -> dict:
    answer = app_client.post(
        "/risk", content=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["results"][0]


def test_the_readme_example_is_critical_with_its_reason(app_client, default_model):
    got = risk(app_client, README_BODY)
    assert got["level"] == "critical"
    assert got["reason"].startswith("loss is nan at step 2")
    # the forecast is the model's, as if the reason were not there
    frame = {"step": np.arange(3), "loss": [2.51, np.nan, np.nan], "grad_norm": [0.9, 0.8, np.inf]}
    import pandas as pd

    assert got["probability"] == default_model.predict_window(pd.DataFrame(frame), context={})
    assert got["probability"] < default_model.thresholds["watch"]  # the forecast alone: ok


@pytest.mark.parametrize(
    ("loss", "grad_norm", "reason"),
    [
        ([2.5, 2.4, "Infinity"], [0.9, 0.8, 0.7], "loss is inf at step 2"),
        ([2.5, 2.4, 2.3], [0.9, 0.8, "-Infinity"], "grad_norm is -inf at step 2"),
        (["NaN", 2.4, None], [0.9, 0.8, 0.7], None),  # null: not measured; 2.4 is the latest
        ([2.5, "NaN", None], [0.9, None, None], "loss is nan at step 1"),  # its latest one
        ([2.5, 2.4, None], [0.9, 0.8, None], None),
    ],
)
def test_latest_measurement_decides(app_client, loss, grad_norm, reason):
    body = {
        "runs": [
            {"run_id": "r", "steps": [0, 1, 2], "signals": {"loss": loss, "grad_norm": grad_norm}}
        ]
    }
    got = risk(app_client, body)
    if reason is None:
        assert got["reason"] is None and got["level"] != "critical"
    else:
        assert got["reason"].startswith(reason) and got["level"] == "critical"


def test_arrow_nan_is_measured_only_where_its_flag_says_so(app_client):
    """In arrays (Arrow, the probe's records) NaN is "not measured" unless the companion
    flag is set, as in run files."""
    steps = np.arange(3)
    loss = np.array([2.5, 2.4, np.nan])
    flagged = {"loss": loss, "loss_nonfinite": np.array([0.0, 0.0, 1.0])}
    headers = {"Content-Type": ARROW_TYPE}
    for columns, level in (({"loss": loss}, None), (flagged, "critical")):
        body = encode_runs([RawRun("a", steps, columns)])
        got = app_client.post("/risk", content=body, headers=headers).json()["results"][0]
        assert (got["level"] == "critical") == (level == "critical"), got
        assert (got["reason"] is not None) == (level == "critical")


def test_explain_says_it_too(app_client):
    answer = app_client.post(
        "/explain",
        content=json.dumps(README_BODY).encode(),
        headers={"Content-Type": "application/json"},
    ).json()
    assert answer["level"] == "critical" and answer["reason"].startswith("loss is nan")


def test_the_client_reads_the_reason(served, default_model):
    frame = window(1, default_model.schema.signals)
    frame.loc[frame.index[-1], ["loss", "loss_nonfinite"]] = [np.nan, 1.0]  # as the probe writes it
    with RiskClient(served, token=TOKEN, timeout=30.0) as client:
        for arrow in (True, False):
            (result,) = client.risk_many({"r": frame}, arrow=arrow)
            assert result.level == "critical", arrow
            assert result.reason.startswith(f"loss is nan at step {frame['step'].iloc[-1]}")
            healthy = client.risk(frame.iloc[:-1])
            assert healthy.reason is None and healthy.level == default_model.level(
                healthy.probability
            )
