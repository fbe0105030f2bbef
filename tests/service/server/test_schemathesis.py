"""schemathesis (pinned in the dev extra) against the served instance's /docs.json, as
its command line runs it (examples, coverage and fuzzing phases, deterministic): what
the schema allows is answered, what it forbids is refused, never a 5xx, and every answer
has a documented status, content type and body schema.

The coverage phase is what found the service's conformance failures (boolean steps
accepted on /risk and /explain, /reload without a body, ``{"runs": []}`` refused); its
cases are a fixed list, so the run is the same every time (~300 cases, ~25 s here).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TOKEN, until_every_worker_serves

pytest.importorskip("schemathesis")  # the dev extra; CI installs it

COMMAND = str(Path(sys.executable).with_name("schemathesis"))
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance,negative_data_rejection,positive_data_acceptance"
)
# /risk and /explain also refuse bodies the schema cannot describe (signal columns of
# another length than the steps, steps not increasing, unknown signal names): a 400 for
# a schema-valid body is a documented answer there, not a conformance failure
CONFIG = """
[[operations]]
include-path-regex = "^/(risk|explain)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "409"]
"""


@pytest.fixture
def reloads_undone(served, default_model):
    """The schema's example reloads the registry's champion: the default serves after."""
    from collapse_guard.service import RiskClient

    yield
    with RiskClient(served, token=TOKEN, timeout=60.0) as client:
        client.reload("default")
    until_every_worker_serves(served, default_model.meta["version"])


@pytest.mark.slow  # ~25 s: ~300 requests, a few of them reloads
def test_the_service_keeps_its_published_schema(served, tmp_path, reloads_undone):
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG, encoding="utf-8")
    done = subprocess.run(
        [
            COMMAND,
            "--config-file",
            str(config),
            "run",
            f"{served}/docs.json",
            "--header",
            f"Authorization: Bearer {TOKEN}",
            "--include-path-regex",
            "^/(risk|explain|model|reload)$",
            "--checks",
            CHECKS,
            "--max-examples",
            "25",
            "--generation-deterministic",
            "--workers",
            "1",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        check=False,
    )
    summary = done.stdout[-3000:]
    assert done.returncode == 0, summary
    cases = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert cases and cases[1] == cases[2] and int(cases[1]) >= 200, summary
    print(f"\nschemathesis: {cases[1]} cases, all passed")
