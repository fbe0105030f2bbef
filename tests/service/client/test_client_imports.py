"""The client side imports light: a training loop never loads the server's dependencies."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import collapse_guard.service.client as client_side

HEAVY = ("bentoml", "starlette", "fastapi", "lightgbm", "torch")


def test_importing_the_client_side_imports_no_server_dependency_and_no_server_module():
    modules = [
        f"{client_side.__name__}.{m.name}" for m in pkgutil.iter_modules(client_side.__path__)
    ]
    assert "collapse_guard.service.client.risk_client" in modules  # the walk saw the package
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print([m for m in sys.modules if m.split('.')[0] in {HEAVY!r}])\n"
        "print([m for m in sys.modules if m.startswith('collapse_guard.service.')"
        " and not m.startswith('collapse_guard.service.client')])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["[]", "[]"], done.stdout + done.stderr
