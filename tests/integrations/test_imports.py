"""The integrations' frameworks are optional: the core imports without them, and an
integration without its framework says which extra to install."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

FRAMEWORKS = ("transformers", "accelerate", "lightning", "pytorch_lightning")


def test_the_core_and_the_package_import_no_framework():
    code = (
        "import sys, collapse_guard, collapse_guard.guard, collapse_guard.integrations\n"
        f"print(sorted(set({FRAMEWORKS!r}) & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "framework", "extra"),
    [("huggingface", "transformers", "[hf]"), ("lightning", "lightning.pytorch", "[lightning]")],
)
def test_an_integration_without_its_framework_names_the_extra(
    monkeypatch, module, framework, extra
):
    name = f"collapse_guard.integrations.{module}"
    monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, framework, None)  # import of it fails, as if absent
    with pytest.raises(ImportError, match=rf"pip install 'collapse-guard\{extra}'"):
        importlib.import_module(name)
