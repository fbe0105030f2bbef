"""Guard(risk=FOLDER) with a tampered or cut model folder: a clear error at construction,
before training starts (issue 31, 1. and 2.), never a dead process or a ValueError
from the loop's first reading."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from guard_helpers import tiny_model

from collapse_guard.errors import UserInputError
from collapse_guard.guard import Guard
from collapse_guard.predictor.core.risk import DEFAULT_MODEL_DIR


@pytest.fixture
def folder(tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    return copy


def _edit(folder, key, value):
    spec = json.loads((folder / "risk_model.json").read_text())
    if key in spec["thresholds"]:
        spec["thresholds"][key] = value
    else:
        spec[key] = value
    (folder / "risk_model.json").write_text(json.dumps(spec))


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("watch", math.nan, "thresholds.watch"),
        ("warn", 1.5, "thresholds.warn"),
        ("critical", -1, "thresholds.critical"),
        ("hold_steps", -5, "hold_steps"),
        ("hold_steps", 10**9, "hold_steps"),
    ],
)
def test_a_tampered_folder_is_refused_at_construction(folder, tmp_path, key, value, field):
    _edit(folder, key, value)
    model, opt = tiny_model()
    with pytest.raises(UserInputError, match=field) as caught:
        Guard(model, opt, tmp_path / "ckpt", risk=str(folder))
    assert str(folder) in str(caught.value)


def test_a_cut_model_file_is_refused_at_construction(folder, tmp_path):
    data = (folder / "model.txt").read_bytes()
    (folder / "model.txt").write_bytes(data[: int(len(data) * 0.99)])
    model, opt = tiny_model()
    with pytest.raises(UserInputError, match=r"model\.txt is cut short"):
        Guard(model, opt, tmp_path / "ckpt", risk=str(folder))
