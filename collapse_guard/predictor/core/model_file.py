"""A model folder read so that nothing in it can crash the process or switch its alarms off.

The one loader under ``RiskModel.load_folder`` (predictor.core.risk), so under everything
that loads a model (``RiskModel.load``, ``Guard(risk=FOLDER)``, the service's start,
``/reload`` and ``collapse-guard serve --model``). :func:`read_model_folder` reads each
of the folder's two files once, into memory, and checks them before the caller's
LightGBM parses a byte:

1. ``risk_model.json``: JSON, this code's format version, and levels and hold that keep
   the alarms working (:func:`check_levels`): each level a finite number in (0, 1],
   ``watch <= warn <= critical``; ``hold_steps`` a whole number in [0, ``MAX_HOLD_STEPS``].
   A NaN or > 1 level never fires, a negative one always fires, a negative hold stops the
   loop at its first reading: each is a :class:`ModelFormatError` naming the field.
2. ``model.txt``, structurally (:func:`check_booster_text`, no LightGBM): UTF-8, no NUL,
   ``tree`` first, as many ``Tree=`` blocks as ``tree_sizes=`` declares, of exactly the
   declared bytes, then ``end of trees``, a ``parameters:`` block closed by
   ``end of parameters``, and the ``pandas_categorical:`` line the Python package
   appends, whole. A file cut anywhere fails here.
3. ``model.txt`` through LightGBM, in a child process (:func:`check_booster_bytes`): a
   fresh interpreter (never a fork of a threaded server) loads, by ``ctypes`` on the very
   library this process uses, **the same bytes** the caller will parse, by **the same
   entry points** ``lightgbm.Booster(model_str=...)`` calls
   (``LGBM_BoosterLoadModelFromString``, ``GetNumClasses``, ``GetLoadedParam``), then
   what the callers use (feature names, tree count, ``DumpModel`` for the explainer,
   ``SaveModelToString`` for the fingerprint, normal and contribution predictions). No
   imports: ~0.1 s. A child that dies is a :class:`ModelFileError` naming the file and
   how it died; the caller never parses a file the child could not.

Why 3. alone was not enough: the checking child used to parse the *file*
(``LGBM_BoosterCreateFromModelfile``) and never asked for the loaded parameters, while
the process parsed a *string* and ``Booster.__init__`` then calls
``LGBM_BoosterGetLoadedParam``, which segfaults on a file cut inside its trailing
``parameters:`` block (6 of 12 cuts in the last 5 % of a 40-tree file; issue 31). The
child passed them all.

Nothing is copied to a temporary folder: the bytes checked are the bytes returned, held
in memory, whatever happens to the files meanwhile. No lightgbm import here (the child
finds the library through the ``lightgbm`` package only when a check runs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapse_guard.predictor.core.hold import MAX_HOLD_STEPS
from collapse_guard.predictor.core.levels import ThresholdError, check_thresholds

__all__ = [
    "BOOSTER_FILE",
    "FORMAT_VERSION",
    "MAX_HOLD_STEPS",
    "SPEC_FILE",
    "ModelFileError",
    "ModelFiles",
    "ModelFormatError",
    "check_booster_bytes",
    "check_booster_file",
    "check_booster_text",
    "check_levels",
    "read_model_folder",
    "staged_model",
]

FORMAT_VERSION = 1  # layout of the folder; bump when a file or a key changes meaning
BOOSTER_FILE = "model.txt"  # RiskModel.save's names
SPEC_FILE = "risk_model.json"
_CHILD_SECONDS = 120.0  # a 300-tree model parses in well under a second here
_FIX = "save the model again (RiskModel.save) or copy the whole folder again"


class ModelFormatError(ValueError):
    """A model folder cannot be used with this code (names the folder and the fix)."""


class ModelFileError(ModelFormatError):
    """A ``model.txt`` that is cut short, damaged, or that LightGBM cannot read."""


@dataclass(frozen=True)
class ModelFiles:
    """A model folder's contents, checked: what the caller parses."""

    folder: Path
    spec: dict[str, Any]
    booster_text: str  # exactly the bytes the child loaded, decoded
    n_trees: int
    thresholds: dict[str, float]
    hold_steps: int


# ------------------------------------------------------------------ the folder
def read_model_folder(folder: str | Path) -> ModelFiles:
    """The two files of ``folder``, each read once and checked (module docstring).

    Raises FileNotFoundError for a folder without both files, :class:`ModelFormatError`
    for a spec this code cannot use (its message names the folder and the field),
    :class:`ModelFileError` for a booster file that is damaged or crashes LightGBM.
    """
    folder = Path(folder)
    spec_path, booster_path = folder / SPEC_FILE, folder / BOOSTER_FILE
    if not spec_path.is_file() or not booster_path.is_file():
        raise FileNotFoundError(
            f"{folder} is not a model folder: expected {SPEC_FILE} and {BOOSTER_FILE} "
            "in it (written by RiskModel.save)"
        )
    spec_bytes, booster_bytes = spec_path.read_bytes(), booster_path.read_bytes()
    try:
        spec = json.loads(spec_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelFormatError(f"{folder}: {SPEC_FILE} is not JSON ({error}); {_FIX}") from None
    if not isinstance(spec, dict):
        raise ModelFormatError(
            f"{folder}: {SPEC_FILE} holds a {type(spec).__name__}, not an object; {_FIX}"
        )
    if spec.get("format_version") != FORMAT_VERSION:
        raise ModelFormatError(
            f"{folder}: model format version {spec.get('format_version')!r}, this code "
            f"reads version {FORMAT_VERSION}; retrain the model with this version "
            "(collapse-guard train) or use the collapse-guard release that saved it"
        )
    thresholds, hold = check_levels(
        spec.get("thresholds"), spec.get("hold_steps", 0), where=f"{folder}: {SPEC_FILE}"
    )
    try:
        n_trees = check_booster_bytes(booster_bytes)
    except ModelFileError as error:
        raise ModelFileError(f"{folder}: {error}") from None
    return ModelFiles(folder, spec, booster_bytes.decode("utf-8"), n_trees, thresholds, hold)


# ------------------------------------------------------------------ the levels
def check_levels(thresholds: Any, hold_steps: Any, *, where: str) -> tuple[dict[str, float], int]:
    """``(thresholds, hold_steps)`` as a model may store them, else a
    :class:`ModelFormatError` that starts with ``where`` and names the field.

    The levels by the one rule of ``levels.check_thresholds`` (finite numbers in (0, 1],
    ``watch <= warn <= critical``). ``hold_steps`` is a whole number (not a bool, not a
    float) in [0, MAX_HOLD_STEPS].
    """
    fix = "set them with RiskModel.with_thresholds or collapse-guard calibrate, then save"
    try:
        levels = check_thresholds(thresholds)
    except ThresholdError as error:
        raise ModelFormatError(f"{where}: {error}; {fix}") from None
    if isinstance(hold_steps, bool) or not isinstance(hold_steps, int):
        raise ModelFormatError(
            f"{where}: hold_steps must be a whole number in [0, {MAX_HOLD_STEPS}]; got "
            f"{type(hold_steps).__name__} {hold_steps!r}; fix it to e.g. 50 (the default)"
        )
    if not 0 <= hold_steps <= MAX_HOLD_STEPS:
        raise ModelFormatError(
            f"{where}: hold_steps must be in [0, {MAX_HOLD_STEPS}]; got {hold_steps}; "
            "fix it to e.g. 50 (the default)"
        )
    return levels, hold_steps


# ---------------------------------------------------------- the booster file
_TREE_SIZES = re.compile(r"^tree_sizes=(.*)$", re.M)
_TREE = re.compile(r"^Tree=\d+$", re.M)
_PANDAS_KEY = "pandas_categorical:"


def check_booster_text(data: bytes) -> int:
    """The tree count ``data`` (a ``model.txt``) declares, after checking it is whole
    (module docstring, 2.); else a :class:`ModelFileError` saying what is missing."""

    def damaged(what: str) -> ModelFileError:
        return ModelFileError(f"{BOOSTER_FILE} is cut short or damaged: {what}; {_FIX}")

    if b"\0" in data:
        raise damaged("it holds a NUL byte")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise damaged(f"it is not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not text.startswith("tree\n"):
        raise damaged("it does not start with LightGBM's 'tree' line")
    declared = _TREE_SIZES.search(text)
    if declared is None:
        raise damaged("no 'tree_sizes=' line in its header")
    try:
        sizes = [int(s) for s in declared.group(1).split()]
    except ValueError:
        raise damaged("its 'tree_sizes=' line is not whole numbers") from None
    trees = [m.start() for m in _TREE.finditer(text)]
    if len(trees) != len(sizes):
        raise damaged(f"its header declares {len(sizes)} trees, {len(trees)} are there")
    end = text.find("\nend of trees\n")
    if end < 0:
        raise damaged("no 'end of trees' line")
    if sizes and len(text[trees[0] : end + 1].encode()) != sum(sizes):
        raise damaged(f"its trees are not the {sum(sizes)} bytes the header declares")
    params = text.find("\nparameters:\n", end)
    closed = text.find("\nend of parameters\n", max(params, 0))
    if params < 0 or closed < 0:
        raise damaged("its 'parameters:' block is missing or not closed by 'end of parameters'")
    last = text[closed + len("\nend of parameters\n") :].strip("\n")
    if "\n" in last or not last.startswith(_PANDAS_KEY) or not text.endswith("\n"):
        raise damaged(f"it does not end with the '{_PANDAS_KEY}' line after the parameters")
    try:
        json.loads(last[len(_PANDAS_KEY) :])
    except json.JSONDecodeError:
        raise damaged(f"its '{_PANDAS_KEY}' line is cut") from None
    return len(sizes)


# Run by the child: the model string from stdin, loaded as lightgbm.Booster(model_str=)
# loads it, then used as the callers use it. Prints the tree count; exits 1 with
# LightGBM's own message; a native crash is the child's death, not the caller's.
_CHILD = r"""
import ctypes, json, sys
data = sys.stdin.buffer.read()
lib = ctypes.CDLL(sys.argv[1])
lib.LGBM_GetLastError.restype = ctypes.c_char_p
def check(code):
    if code != 0:
        sys.exit(lib.LGBM_GetLastError().decode(errors="replace")[:300])
handle, iters, classes = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
check(lib.LGBM_BoosterLoadModelFromString(
    ctypes.c_char_p(data), ctypes.byref(iters), ctypes.byref(handle)))
check(lib.LGBM_BoosterGetNumClasses(handle, ctypes.byref(classes)))
def text(call, *args):  # a string out, grown as Booster._get_loaded_param grows it
    size, need = 1 << 20, ctypes.c_int64()
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        check(call(handle, *args, ctypes.c_int64(size), ctypes.byref(need),
                   ctypes.c_char_p(ctypes.addressof(buf))))
        if need.value <= size:
            return buf.value.decode("utf-8")
        size = need.value
    sys.exit("LightGBM gave a string longer than it said")
json.loads(text(lib.LGBM_BoosterGetLoadedParam))
json.loads(text(lib.LGBM_BoosterDumpModel, ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_int(0)))
text(lib.LGBM_BoosterSaveModelToString, ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_int(0))
width, trees = ctypes.c_int(), ctypes.c_int()
check(lib.LGBM_BoosterGetNumFeature(handle, ctypes.byref(width)))
check(lib.LGBM_BoosterNumberOfTotalModel(handle, ctypes.byref(trees)))
n = width.value
size, got, need = 256, ctypes.c_int(), ctypes.c_size_t()
for _ in range(2):  # as Booster.feature_name: again with longer buffers if one was short
    names = [ctypes.create_string_buffer(size) for _ in range(n)]
    ptrs = (ctypes.c_char_p * n)(*map(ctypes.addressof, names))
    check(lib.LGBM_BoosterGetFeatureNames(handle, ctypes.c_int(n), ctypes.byref(got),
          ctypes.c_size_t(size), ctypes.byref(need), ptrs))
    if need.value <= size:
        break
    size = need.value
rows = (ctypes.c_double * (2 * n))(*([0.0] * n + [float("nan")] * n))  # zeros, NaN
out, written = (ctypes.c_double * (2 * (n + 1)))(), ctypes.c_int64()
for kind in (0, 3):  # C_API_PREDICT_NORMAL, C_API_PREDICT_CONTRIB
    check(lib.LGBM_BoosterPredictForMat(handle, rows, 1, 2, n, 1, kind, 0, -1,
          b"num_threads=1", ctypes.byref(written), out))
print(trees.value)
"""


def check_booster_bytes(data: bytes) -> int:
    """The number of trees of a ``model.txt`` given as its bytes: checked whole, then
    loaded and used in a child process exactly as ``lightgbm.Booster(model_str=
    data.decode())`` will be in this one. A damaged file, or one that crashes or hangs
    LightGBM, is a :class:`ModelFileError`."""
    declared = check_booster_text(data)
    env = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive", "PATH": os.defpath}
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _CHILD, _library()],
            input=data,
            capture_output=True,
            timeout=_CHILD_SECONDS,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise ModelFileError(
            f"LightGBM did not finish reading {BOOSTER_FILE} in {_CHILD_SECONDS:.0f} s; {_FIX}"
        ) from None
    said = _first_complaint(done.stderr.decode(errors="replace"))
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        raise ModelFileError(
            f"LightGBM crashed reading {BOOSTER_FILE} (the checking process died of {name}"
            f"{': ' + said if said else ''}); the file is damaged or truncated; {_FIX}"
        )
    if done.returncode != 0:
        raise ModelFileError(
            f"LightGBM cannot read {BOOSTER_FILE} (exit {done.returncode}: {said or 'no message'})"
            f"; the file is damaged or truncated; {_FIX}"
        )
    trees = int(done.stdout.split()[-1])
    if trees != declared:
        raise ModelFileError(
            f"LightGBM read {trees} trees from {BOOSTER_FILE}, its header declares {declared}; "
            f"{_FIX}"
        )
    return trees


def check_booster_file(path: Path) -> int:
    """:func:`check_booster_bytes` of the file at ``path`` (read once)."""
    return check_booster_bytes(Path(path).read_bytes())


def _library() -> str:
    import lightgbm.basic

    # the shared library this process loaded: the child checks with the same binary
    return lightgbm.basic._LIB._name


def _first_complaint(stderr: str) -> str:
    """LightGBM's first ``[Fatal]`` line (it repeats it per thread, quoting the damaged
    bytes it met), else the last line; printable characters only."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    fatal = [line for line in lines if "[Fatal]" in line]
    line = (fatal or lines or [""])[0 if fatal else -1]
    return "".join(c for c in line if c.isprintable()).strip()[:200]


@contextmanager
def staged_model(folder: Path) -> Iterator[Path]:
    """A private copy of a model folder's two files, deleted on exit, also when the
    body raises. (The loader itself needs none: it holds the bytes it checked.)"""
    tmp = tempfile.mkdtemp(prefix="collapse-guard-check-")
    try:
        for name in (SPEC_FILE, BOOSTER_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(
                    f"not a model folder: expected {SPEC_FILE} and {BOOSTER_FILE} in it "
                    "(written by RiskModel.save)"
                )
            shutil.copyfile(folder / name, Path(tmp) / name)
        yield Path(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
