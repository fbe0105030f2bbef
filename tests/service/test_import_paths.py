"""The service's packages import light, and its old module paths still work (one release)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

# old module -> the modules its names moved to
OLD_PATHS = {
    "arrow_codec": ("client.arrow_writer", "client.raw_run", "server.arrow_reader"),
    "auth": ("middleware.auth",),
    "body_limit": ("middleware.body_limit",),
    "cli": ("server.serve_command",),
    "errors": ("middleware.bad_request",),
    "json_reader": ("server.json_reader",),
    "limits": ("middleware.limits",),
    "memory": ("middleware.memory",),
    "metrics": ("middleware.metrics",),
    "model_check": ("server.model_check",),
    "model_state": ("server.model_state",),
    "openapi": ("server.openapi",),
    "reload_channel": ("server.reload_channel",),
    "runs": ("client.raw_run", "server.windows", "server.window_checks", "server.collapse_now"),
    "scoring": ("server.scoring",),
    "service": ("server.risk_service",),
    "transport": ("client.transport",),
    "treeshap": ("server.treeshap",),
    "wire": ("client.wire",),
}
# what code outside the service imports by an old path
CALLED_BY_OLD_PATHS = {
    "arrow_codec": {"ARROW_TYPE", "RawRun", "encode_runs", "decode_runs"},
    "cli": {"serve_command"},
    "client": {"RiskClient", "as_raw_run", "encode_json"},
    "model_state": {"ModelLoadError", "load_serving"},
    "service": {"RiskService"},
    "transport": {"KeepAliveTransport"},
}


def _service_module(name: str):
    return importlib.import_module(f"collapse_guard.service.{name}")


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_old_path_gives_the_same_objects_as_the_new_ones(old):
    module = _service_module(old)
    new = [_service_module(name) for name in OLD_PATHS[old]]
    assert module.__all__
    for name in module.__all__:
        (value,) = {
            id(getattr(m, name)): getattr(m, name) for m in new if hasattr(m, name)
        }.values()
        assert getattr(module, name) is value, (old, name)


@pytest.mark.parametrize("old", sorted(CALLED_BY_OLD_PATHS))
def test_the_names_callers_import_by_an_old_path_are_there(old):
    assert CALLED_BY_OLD_PATHS[old] <= set(_service_module(old).__all__)


def _fresh(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout.split()


def test_the_old_bentoml_target_serves_the_same_service():
    assert _fresh(
        "from bentoml._internal.service.loader import import_service; "
        "from collapse_guard.service.server.risk_service import RiskService; "
        "print(import_service('collapse_guard.service.service:RiskService') is RiskService)"
    ) == ["True"]


def test_client_imports_light_and_the_service_without_torch():
    code = (
        "import sys, collapse_guard.service as s; s.RiskClient; "
        "print([m for m in ('torch', 'lightgbm', 'sklearn', 'bentoml', 'mlflow') "
        "if m in sys.modules]); "
        "import collapse_guard.service.server.risk_service; print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["[]", "False"], done.stdout + done.stderr
