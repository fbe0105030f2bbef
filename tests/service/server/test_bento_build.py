"""`bentoml build` makes a Bento of the service offline (no package index reached)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import collapse_guard

ROOT = Path(collapse_guard.__file__).resolve().parent.parent


@pytest.mark.slow  # a subprocess build, ~6 s on a busy machine
def test_bentoml_build_succeeds_offline(tmp_path):
    env = dict(os.environ)
    env.update(
        BENTOML_HOME=str(tmp_path / "bentoml"),
        # bentoml 1.4.40's image path runs `uv` (installing it from PyPI if absent) even
        # with lock_packages: false; the bentofile path it falls back to with no_image
        # only writes requirements.txt and the Dockerfile
        BENTOML_ENABLE_FEATURES="no_image",
        # any attempt to reach an index or the network fails the build
        PIP_NO_INDEX="1",
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
    )
    bentoml = Path(sys.executable).with_name("bentoml")
    args = [str(bentoml), "build", "-f", "collapse_guard/service/bentofile.yaml", "."]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (bento,) = [
        p for p in (tmp_path / "bentoml/bentos/collapse-guard-risk").iterdir() if p.name != "latest"
    ]
    info = yaml.safe_load((bento / "bento.yaml").read_text())
    assert info["service"] == "collapse_guard.service.server.risk_service:RiskService"
    assert (bento / "src/collapse_guard/service/server/risk_service.py").is_file()
    assert (bento / "src/collapse_guard/predictor/default_model/model.txt").is_file()
    assert (bento / "env/docker/Dockerfile").is_file()
    requirements = (bento / "env/python/requirements.txt").read_text()
    assert "lightgbm" in requirements and "bentoml==" in requirements
    assert "torch" not in requirements  # the service never imports it
