"""Set-up of the real-client tests: the integrations' set-up and the lifecycle's fixtures.

Test folders are not packages and each ``conftest.py`` is imported as ``conftest``
(``tests/support.py``), so the two folders' set-ups are loaded here by path under names of
their own: the integrations' (no ``datasets`` namespace package before transformers is
imported; both frameworks required under CI) and the predictor's lifecycle fixtures (a fresh SQLite
MLflow store per test, the 60 base runs a retrain starts from).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# before torch and lightgbm (docs/stack.md, "OpenMP")
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

_TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_TESTS / "predictor"))  # predictor_settings
sys.path.insert(0, str(_TESTS / "predictor" / "lifecycle"))  # lifecycle_models
sys.path.insert(0, str(Path(__file__).parent))  # real_clients


def _load(folder: str):
    name = f"{folder}_setup"
    spec = importlib.util.spec_from_file_location(name, _TESTS / folder / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_load("integrations")
_predictor = _load("predictor")
empty_store, store = _predictor.empty_store, _predictor.store  # base, base_paths: the root's


@pytest.fixture(scope="session")
def client_runs(tmp_path_factory):
    """The three clients' guarded runs (``real_clients``), each in a folder of its own:
    name -> ClientRun. Made once per session (about 45 s on 2 busy cores)."""
    pytest.importorskip("accelerate")
    pytest.importorskip("transformers")
    pytest.importorskip("lightning.pytorch")
    import torch
    from real_clients import lightning_fit, llama_trainer, nanogpt_loop

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: the same numbers whatever the core count
    try:
        root = tmp_path_factory.mktemp("clients")
        return {
            run.name: run
            for run in (
                client(root / client.__name__)
                for client in (nanogpt_loop, llama_trainer, lightning_fit)
            )
        }
    finally:
        torch.set_num_threads(threads)
