"""A model whose model.txt is cut inside its parameters block, or whose levels or hold
are tampered with, is refused by ``/reload`` (409, naming the field; the old model keeps
serving, no worker dies) and by ``collapse-guard serve --model`` (one line, exit 2):
issue 31, 1. and 2."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TOKEN, window, worker_pids

from collapse_guard.service import RequestRejected, RiskClient

COMMAND = str(Path(sys.executable).with_name("collapse-guard"))
TAMPERED = [
    ("watch", math.nan, "thresholds.watch"),
    ("warn", math.inf, "thresholds.warn"),
    ("critical", 1.5, "thresholds.critical"),
    ("watch", -1, "thresholds.watch"),
    ("order", None, "out of order"),
    ("hold_steps", -5, "hold_steps"),
    ("hold_steps", 10**9, "hold_steps"),
]


def _tampered(variant_dir: Path, root: Path, key: str, value) -> Path:
    folder = root / f"{key}-{value}" / "model"
    shutil.copytree(variant_dir, folder)
    spec = json.loads((folder / "risk_model.json").read_text())
    if key == "order":
        spec["thresholds"]["watch"] = spec["thresholds"]["critical"] + 0.01
    elif key in spec["thresholds"]:
        spec["thresholds"][key] = value
    else:
        spec[key] = value
    (folder / "risk_model.json").write_text(json.dumps(spec))
    return folder


def _cut(variant_dir: Path, root: Path, fraction: float) -> Path:
    folder = root / f"cut-{fraction}" / "model"
    shutil.copytree(variant_dir, folder)
    data = (folder / "model.txt").read_bytes()
    (folder / "model.txt").write_bytes(data[: int(len(data) * fraction)])
    return folder


@pytest.fixture(scope="module")
def client(served, default_model):
    with RiskClient(served, token=TOKEN, timeout=60.0) as c:
        yield c


def test_reload_refuses_tampered_levels_and_cut_files(
    served, served_server, client, default_model, variant_dir, tmp_path
):
    frame = window(3, default_model.schema.signals)
    workers = worker_pids(served_server[1])
    for key, value, field in TAMPERED:
        with pytest.raises(RequestRejected) as caught:
            client.reload(str(_tampered(variant_dir, tmp_path, key, value)))
        assert caught.value.status == 409 and field in caught.value.message, caught.value.message
        assert str(tmp_path) not in caught.value.message  # no server path
    for fraction in (0.97, 0.98, 0.99, 0.995, 0.999):  # inside the trailing parameters block
        with pytest.raises(RequestRejected) as caught:
            client.reload(str(_cut(variant_dir, tmp_path, fraction)))
        assert caught.value.status == 409 and "model.txt" in caught.value.message
    # the old model still serves, in the same workers: none died on a load
    assert client.risk(frame).model_version == default_model.meta["version"]
    assert worker_pids(served_server[1]) == workers


@pytest.mark.parametrize("case", ["nan", "hold", "cut"])
def test_serve_refuses_a_tampered_model_in_one_line(variant_dir, tmp_path, case):
    if case == "cut":
        folder, words = _cut(variant_dir, tmp_path, 0.99), "model.txt is cut short"
    elif case == "nan":
        folder, words = _tampered(variant_dir, tmp_path, "watch", math.nan), "thresholds.watch"
    else:
        folder, words = _tampered(variant_dir, tmp_path, "hold_steps", -5), "hold_steps"
    done = subprocess.run(
        [COMMAND, "serve", "--model", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert words in lines[0] and "Traceback" not in done.stderr
