"""schemathesis (pinned in the dev extra) against the served instance's /docs.json: what
the schema allows is answered, what it forbids is refused, never a 5xx, and every answer
has a documented status, content type and body schema.

Cases come from ``APIOperation.as_strategy`` under hypothesis' own ``@given`` (seeded,
bounded): schemathesis' pytest plugin does not run under this pytest (9.2).
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")  # the dev extra; CI installs it

from helpers import AUTH  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

# cases per route and mode (a /reload that loads a model takes ~1 s of the 2 workers)
CASES = {"/risk": 40, "/explain": 30, "/model": 5, "/reload": 12}
ROUTES = tuple(CASES)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# /risk and /explain also refuse bodies the schema cannot describe (signal columns of
# another length than the steps, steps not increasing, unknown signal names): a 400 for
# a schema-valid body is their documented answer there, not a conformance failure
ACCEPTS_EVERY_VALID_BODY = {"/model", "/reload"}


@pytest.fixture(scope="module")
def operations(served):
    schema = schemathesis.openapi.from_url(f"{served}/docs.json", headers=AUTH)
    found = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path in ROUTES:
            found[operation.path] = operation
    assert sorted(found) == sorted(ROUTES)
    return found


@pytest.mark.parametrize(
    ("path", "mode"),
    [
        (path, mode)
        for path in ROUTES
        for mode in GenerationMode
        if (path, mode.value) != ("/model", "negative")
    ],
)
def test_the_service_keeps_its_published_schema(operations, path, mode):
    """(GET /model has nothing a case could get wrong: no negative cases.)"""
    checks = CHECKS + ([positive_data_acceptance] if path in ACCEPTS_EVERY_VALID_BODY else [])

    @settings(
        max_examples=CASES[path],
        derandomize=True,  # the same cases every run
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operations[path].as_strategy(generation_mode=mode))
    def answers_as_published(case):
        case.call_and_validate(headers=AUTH, checks=checks, timeout=60)

    answers_as_published()
