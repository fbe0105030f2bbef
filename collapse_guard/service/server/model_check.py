"""A model's files, read where a native crash cannot take a worker down.

LightGBM aborts its process on some damaged model files (a truncated ``model.txt``:
``[Fatal] Model format error``, ``terminate called``, exit 134) instead of raising. So
before a worker parses a new model, :func:`staged_model` copies its files into a private
folder (what is checked is exactly what is then loaded, whatever happens to the source
meanwhile), and :func:`check_booster_file` has a fresh interpreter (a new process, never
a fork of the threaded server) parse the copy and score two rows through LightGBM's C
API, by ``ctypes`` on the very library this process uses: no imports, ~0.1 s, where a
child importing the ``lightgbm`` package took 5 s here. A child that dies is a
:class:`ModelFileError` naming how it died; the worker itself never parses a file the
child could not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["BOOSTER_FILE", "ModelFileError", "check_booster_file", "staged_model"]

BOOSTER_FILE = "model.txt"  # RiskModel.save's names
_SPEC_FILE = "risk_model.json"
_CHILD_SECONDS = 120.0  # a 300-tree model parses in well under a second here

# Run by the child: parse the file, then score a row of zeros and one of NaN (normal and
# contributions), as the service will. Exit 0 and print the tree count, or exit 1 with
# LightGBM's own message; a native abort is the child's death, not the worker's.
_CHILD = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.LGBM_GetLastError.restype = ctypes.c_char_p
def check(code):
    if code != 0:
        sys.exit(lib.LGBM_GetLastError().decode(errors="replace")[:300])
handle, trees, width = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
check(lib.LGBM_BoosterCreateFromModelfile(
    sys.argv[2].encode(), ctypes.byref(trees), ctypes.byref(handle)))
check(lib.LGBM_BoosterGetNumFeature(handle, ctypes.byref(width)))
n = width.value
out, written = (ctypes.c_double * (n + 1))(), ctypes.c_int64()
for value in (0.0, float("nan")):
    row = (ctypes.c_double * n)(*([value] * n))
    for kind in (0, 3):  # C_API_PREDICT_NORMAL, C_API_PREDICT_CONTRIB
        check(lib.LGBM_BoosterPredictForMatSingleRow(
            handle, row, 1, n, 1, kind, 0, -1, b"", ctypes.byref(written), out))
print(trees.value)
"""


class ModelFileError(Exception):
    """A model file that LightGBM cannot read (the message names no server path)."""


def _library() -> str:
    import lightgbm.basic

    # the shared library this process loaded: the child checks with the same binary
    return lightgbm.basic._LIB._name


def check_booster_file(path: Path) -> int:
    """The number of trees of ``path``, parsed and scored in a child process."""
    env = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive", "PATH": os.defpath}
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _CHILD, _library(), str(path)],
            capture_output=True,
            timeout=_CHILD_SECONDS,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise ModelFileError(
            f"LightGBM did not finish reading {BOOSTER_FILE} in {_CHILD_SECONDS:.0f} s"
        ) from None
    said = _first_complaint(done.stderr.decode(errors="replace").replace(str(path), BOOSTER_FILE))
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        raise ModelFileError(
            f"LightGBM crashed reading {BOOSTER_FILE} (the checking process died of {name}"
            f"{': ' + said if said else ''}); the file is damaged or truncated"
        )
    if done.returncode != 0:
        raise ModelFileError(
            f"LightGBM cannot read {BOOSTER_FILE} (exit {done.returncode}: {said or 'no message'})"
            "; the file is damaged or truncated"
        )
    return int(done.stdout.split()[-1])


def _first_complaint(stderr: str) -> str:
    """LightGBM's first ``[Fatal]`` line (it repeats it per thread, quoting the damaged
    bytes it met), else the last line; printable characters only."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    fatal = [line for line in lines if "[Fatal]" in line]
    line = (fatal or lines or [""])[0 if fatal else -1]
    return "".join(c for c in line if c.isprintable()).strip()[:200]


@contextmanager
def staged_model(folder: Path) -> Iterator[Path]:
    """A private copy of a model folder's two files, deleted on exit."""
    with tempfile.TemporaryDirectory(prefix="collapse-guard-check-") as tmp:
        for name in (_SPEC_FILE, BOOSTER_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(
                    f"not a model folder: expected {_SPEC_FILE} and {BOOSTER_FILE} in it "
                    "(written by RiskModel.save)"
                )
            shutil.copyfile(folder / name, Path(tmp) / name)
        yield Path(tmp)
