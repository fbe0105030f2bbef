"""The README's service examples: the curl body is answered, the client calls exist."""

from __future__ import annotations

import re

from documents import curl_body, section


def _section() -> str:
    return section("The risk service")


def test_curl_example_is_answered(app_client):
    body, _ = curl_body(_section())
    answer = app_client.post("/risk", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    (result,) = answer.json()["results"]
    assert result["run_id"] == "a" and result["step"] == 2
    assert 0.0 <= result["probability"] <= 1.0
    # as the README says: its latest loss is a measured NaN, a collapse now
    assert result["level"] == "critical" and result["reason"].startswith("loss is nan at step 2")
    assert "answers `critical`" in _section()


def test_client_example_names_real_methods():
    from collapse_guard.service import RiskClient

    for name in re.findall(r"client\.(\w+)\(", _section()):
        assert hasattr(RiskClient, name), name
