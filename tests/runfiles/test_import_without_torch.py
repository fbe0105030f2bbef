"""The ground floor imports alone: no torch, and none of the parts above it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_LOADED = (
    "import json, sys\nimport collapse_guard.runfiles\nprint(json.dumps(sorted(sys.modules)))\n"
)


def test_importing_runfiles_loads_no_torch_and_nothing_above_it():
    # a fresh interpreter: this one has torch from other tests already
    env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
    done = subprocess.run(
        [sys.executable, "-c", _LOADED], capture_output=True, text=True, env=env, check=True
    )
    loaded = set(json.loads(done.stdout))
    assert "collapse_guard.runfiles.ingest" in loaded  # the package imported every module
    assert "torch" not in loaded
    above = ("collapse_guard.probe", "collapse_guard.datasets", "collapse_guard.predictor")
    assert sorted(m for m in loaded if m.startswith(above)) == []
