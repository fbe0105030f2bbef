"""The one model loader (predictor.core.model_file): a cut model.txt is refused, never
parsed in-process (issue 31, 1.); tampered levels and hold are refused naming the field
(issue 31, 2.); no temporary folder is left behind."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from collapse_guard.predictor.core import model_file
from collapse_guard.predictor.core.model_file import (
    MAX_HOLD_STEPS,
    ModelFileError,
    ModelFormatError,
    check_booster_bytes,
    check_booster_text,
    staged_model,
)
from collapse_guard.predictor.core.risk import RiskModel

N_TREES = 40
# 12 cuts in the last 5 % of model.txt: the parameters block and the line after it
CUTS = np.linspace(0.95, 0.999, 12)


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory) -> Path:
    """A real 40-tree LightGBM model, trained here, in a folder RiskModel.save wrote
    (the bundled model's schema, calibration and levels)."""
    import lightgbm as lgb

    default = RiskModel.load()
    names = list(default.schema.names)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, len(names)))
    y = (X[:, 0] + rng.normal(size=600) > 0).astype(np.float64)
    params = {"objective": "binary", "num_leaves": 7, "verbosity": -1, "num_threads": 1}
    booster = lgb.train(params, lgb.Dataset(X, y, feature_name=names), num_boost_round=N_TREES)
    model = RiskModel(
        booster,
        default.schema,
        default.calibrator,
        default.thresholds,
        horizon=default.horizon,
        budgets=default.budgets,
        hold_steps=default.hold_steps,
        meta={"version": "small"},
    )
    folder = model.save(tmp_path_factory.mktemp("small") / "model")
    assert RiskModel.load(folder).booster.num_trees() == N_TREES
    return folder


def _cut_folders(small_folder: Path, root: Path) -> list[Path]:
    data = (small_folder / "model.txt").read_bytes()
    folders = []
    for k, fraction in enumerate(CUTS):
        folder = root / f"cut{k}"
        folder.mkdir()
        shutil.copyfile(small_folder / "risk_model.json", folder / "risk_model.json")
        (folder / "model.txt").write_bytes(data[: int(len(data) * fraction)])
        folders.append(folder)
    return folders


def _check_folders() -> int:
    return len(list(Path(tempfile.gettempdir()).glob("collapse-guard-check-*")))


# A process that loads each folder named on its command line by RiskModel.load: it dies
# with the signal if a file that crashes LightGBM gets past the check.
_LOADS = """
import sys
from collapse_guard.predictor.core.risk import ModelFormatError, RiskModel
for folder in sys.argv[1:]:
    try:
        RiskModel.load(folder)
        print("loaded", flush=True)
    except ModelFormatError as error:
        print("refused", str(error).replace("\\n", " "), flush=True)
"""


def test_each_cut_in_the_last_5_percent_is_refused_and_the_process_lives(small_folder, tmp_path):
    folders = _cut_folders(small_folder, tmp_path)
    before = _check_folders()
    done = subprocess.run(
        [sys.executable, "-c", _LOADS, str(small_folder), *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert lines[0] == "loaded" and len(lines) == 1 + len(CUTS)
    for folder, line in zip(folders, lines[1:], strict=True):
        assert line.startswith("refused") and "model.txt" in line and str(folder) in line, line
    assert _check_folders() == before  # no temporary copy, on success or refusal


def test_the_cuts_are_hostile_lightgbm_itself_dies_on_one(small_folder, tmp_path):
    """What the check must catch: parsing a cut as RiskModel.load used to (a string, then
    Booster.__init__ asks for the loaded parameters) kills the process."""
    code = (
        "import sys, lightgbm\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        lightgbm.Booster(model_str=open(path, encoding='utf-8').read())\n"
        "    except Exception:\n"
        "        pass\n"
    )
    paths = [str(f / "model.txt") for f in _cut_folders(small_folder, tmp_path)]
    done = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, timeout=300)
    assert done.returncode == -signal.SIGSEGV


def test_the_child_alone_passes_no_cut_that_kills_the_parse(small_folder, monkeypatch):
    """Without the structural check, the child (the same bytes by the same entry points
    as the parse here) refuses each cut that kills the parse: the cuts it lets through,
    parsed as RiskModel.load parses them, leave the process alive. (The old child, the
    file and no loaded parameters, passed all 12; 6 of them then killed the parse.)"""
    data = (small_folder / "model.txt").read_bytes()
    assert check_booster_bytes(data) == N_TREES
    monkeypatch.setattr(model_file, "check_booster_text", lambda data: N_TREES)
    passed, refused = [], 0
    for fraction in CUTS:
        cut = data[: int(len(data) * fraction)]
        try:
            check_booster_bytes(cut)
            passed.append(cut.decode())
        except ModelFileError as error:
            assert "model.txt" in str(error)
            refused += 1
    assert refused >= 6  # the cuts that kill the parse, at least
    code = (
        "import json, sys, lightgbm\n"
        "for text in json.load(sys.stdin):\n"
        "    lightgbm.Booster(model_str=text).dump_model()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(passed), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda t: t[: t.index("\nend of trees")] + t[t.index("\nend of trees") :], None),
        (lambda t: t.replace("tree_sizes=", "tree_sizes=1 "), "declares 41 trees, 40"),
        (lambda t: t.replace("Tree=39\n", "Tree=39\nnum_leaves=7\n", 1), "bytes the header"),
        (lambda t: t.replace("\nend of trees\n", "\n"), "end of trees"),
        (lambda t: t.replace("\nend of parameters\n", "\n"), "end of parameters"),
        (lambda t: t.replace("pandas_categorical:null", "pandas_categorical:nu"), "is cut"),
        (lambda t: t + "x", "pandas_categorical"),
        (lambda t: t.replace("tree\n", "tree\n\0", 1), "NUL"),
    ],
)
def test_the_structural_check(small_folder, edit, why):
    text = (small_folder / "model.txt").read_text(encoding="utf-8")
    edited = edit(text).encode()
    if why is None:
        assert check_booster_text(edited) == N_TREES
    else:
        with pytest.raises(ModelFileError, match=why):
            check_booster_text(edited)
    with pytest.raises(ModelFileError, match="UTF-8"):
        check_booster_text(text.encode()[:-30] + b"\xff\n")


def _tampered(small_folder: Path, root: Path, **changes) -> Path:
    folder = root / "tampered"
    shutil.copytree(small_folder, folder)
    spec = json.loads((small_folder / "risk_model.json").read_text())
    for key, value in changes.items():
        if key in ("watch", "warn", "critical"):
            spec["thresholds"][key] = value
        else:
            spec[key] = value
    (folder / "risk_model.json").write_text(json.dumps(spec))  # NaN, Infinity as Python writes
    return folder


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"watch": math.nan}, "thresholds.watch"),
        ({"warn": math.inf}, "thresholds.warn"),
        ({"critical": -math.inf}, "thresholds.critical"),
        ({"critical": 1.5}, "thresholds.critical"),
        ({"watch": -1}, "thresholds.watch"),
        ({"watch": 0.0}, "thresholds.watch"),
        ({"warn": "0.5"}, "thresholds.warn"),
        ({"warn": True}, "thresholds.warn"),
        ({"watch": 0.9, "warn": 0.5}, "out of order: watch 0.9 > warn 0.5"),
        ({"critical": 0.01}, "out of order: warn"),
        ({"thresholds": {"watch": 0.1, "warn": 0.2}}, "'thresholds' must name exactly"),
        ({"thresholds": None}, "'thresholds' must name exactly"),
        ({"hold_steps": -5}, "hold_steps"),
        ({"hold_steps": 10**9}, "hold_steps"),
        ({"hold_steps": MAX_HOLD_STEPS + 1}, "hold_steps"),
        ({"hold_steps": "50"}, "hold_steps"),
        ({"hold_steps": 50.0}, "hold_steps"),
        ({"hold_steps": False}, "hold_steps"),
    ],
)
def test_tampered_levels_and_hold_are_refused_naming_the_field(
    small_folder, tmp_path, changes, field
):
    folder = _tampered(small_folder, tmp_path, **changes)
    with pytest.raises(ModelFormatError, match=r"risk_model\.json") as caught:
        RiskModel.load(folder)
    assert field in str(caught.value) and str(folder) in str(caught.value)


def test_levels_at_their_edges_load(small_folder, tmp_path):
    # 1 fires only at certainty (a model meant never to alarm), equal levels are ordered
    folder = _tampered(
        small_folder, tmp_path, watch=0.5, warn=0.5, critical=1.0, hold_steps=MAX_HOLD_STEPS
    )
    model = RiskModel.load(folder)
    assert model.thresholds == {"watch": 0.5, "warn": 0.5, "critical": 1.0}
    assert model.hold_steps == MAX_HOLD_STEPS


def test_no_check_folder_is_left_behind(small_folder, tmp_path):
    before = _check_folders()
    RiskModel.load(small_folder)
    with pytest.raises(ModelFileError):
        RiskModel.load(_cut_folders(small_folder, tmp_path)[6])
    with pytest.raises(ModelFormatError):
        RiskModel.load(_tampered(small_folder, tmp_path, watch=math.nan))
    # the server's staged copy: removed also when its body raises
    with pytest.raises(RuntimeError), staged_model(small_folder) as copy:
        assert (copy / "model.txt").is_file()
        raise RuntimeError("a crash in the body")
    assert not copy.exists()
    assert _check_folders() == before


def test_the_loaded_booster_is_the_bytes_checked(small_folder):
    files = model_file.read_model_folder(small_folder)
    assert files.booster_text.encode() == (small_folder / "model.txt").read_bytes()
    assert files.n_trees == N_TREES and files.hold_steps == RiskModel.load().hold_steps
