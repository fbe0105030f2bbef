"""The ring of healthy checkpoints: written atomically and verified, loaded safely, averaged
on rollback when they share a basin.

Every checkpoint is ``guard-<step>.pt`` in the checkpoint folder, a dict of plain values
and tensors (so ``torch.load(weights_only=True)`` reads it: no pickled code runs on
load)::

    {"format": 1, "step": int, "model": state_dict, "optimizer": state_dict,
     "scaler": state_dict | None, "guard": Guard.state_dict(), "loss": float}

beside its sidecar ``guard-<step>.pt.json``: ``{"sha256", "bytes", "step", "loss"}``,
the checksum of the file as written and the recorded loss (the mean of the last finite
losses before it), so that a checkpoint is verified before it is trusted and the ring
can be judged without loading it.

Writing: ``torch.save`` into a temporary name in the same folder (``.<name>.<pid>-*.tmp``),
fsync, checksum, the sidecar written likewise, then the rename over the final name
(atomic on POSIX) and an fsync of the folder: at every instant a checkpoint is either
whole, with its sidecar, or absent. A kill between the two renames leaves a sidecar
without its file (removed at the next start, :meth:`CheckpointRing.clean`). Only healthy
steps are written, and only the oldest beyond ``keep`` are removed, after the new one is
durable: the last healthy checkpoints are never lost. The one of the lowest recorded loss
written stays too (:meth:`CheckpointRing.best`): a developed collapse whose ring trained
worse than it rolls back there (``GuardPolicy.rewind_loss_gap``), and the ring restarts
there (:meth:`CheckpointRing.rewind`).

Beside the ring, ``guard-origin.pt``: the state before the guard's first update (written
once at its first step, kept through resumes, outside the ring's names), the weights a
rescue in the run's warmup restarts from (``GuardPolicy.restart_window``): there every
ring checkpoint was trained at LRs the run could not absorb (:meth:`CheckpointRing.restart`).

Reading (:func:`load_verified`): size and checksum against the sidecar, then the
``weights_only`` load. A file that fails (truncated, empty, random bytes, a flipped bit,
a pickle with code in it) is a :class:`CorruptCheckpoint` naming the file and why; a
resume falls back to the newest valid one and says which it skipped
(:meth:`CheckpointRing.newest_valid`, whose ``accept`` adds the resume's own checks:
keep.py). A checkpoint whose sidecar is missing is checked against the CRC-32 that
``torch.save``'s zip format keeps for each entry (``torch.load`` does not check them): a
flipped bit is caught without the sidecar too. Files written before sidecars existed are
trusted when they pass it and load (and pass the resume's checks).

Rollback averages the parameters of the ring's checkpoints that share a basin with the
newest (:meth:`CheckpointRing.basin`): nearby points of one trajectory, whose mean lies
in the same basin and sits lower in it than any of them (stochastic weight averaging's
argument). A checkpoint far back, or whose recorded loss is far from the newest's (the
first checkpoint of a run, taken while the loss still fell fast), lies elsewhere: the
mean of two such points belongs to neither. The optimizer state is *not* averaged but
taken from the newest: it is a running statistic of the gradients along the trajectory
(Adam's moments with their ``step`` count for bias correction, Lion's and SGD's
momentum), not a point in weight space; a mean of moments of different ages belongs to
no trajectory and would carry three bias corrections at once, while the newest one is
the latest estimate made under healthy training.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import re
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from collapse_guard._durable import fsync_dir
from collapse_guard.errors import UserInputError

__all__ = [
    "FORMAT",
    "ORIGIN",
    "CheckpointFolderError",
    "CheckpointRing",
    "CorruptCheckpoint",
    "average_states",
    "load_checkpoint",
    "load_verified",
    "read_sidecar",
    "save_atomic",
    "sidecar",
    "verify",
]

FORMAT = 1  # layout of a checkpoint dict; bump when a key changes meaning
ORIGIN = "guard-origin.pt"  # the state the guard started from (CheckpointRing.origin)
_NAME = re.compile(r"^guard-(\d+)\.pt$")
# the temp files of killed writes (a ring checkpoint's or the origin's, or their sidecars)
_TEMP = re.compile(r"^\.guard-(?:\d+|origin)\.pt(?:\.json)?\.(?:(\d+)-)?[^.]*\.tmp$")
_RUN_TEMP = re.compile(r"^\.run-.+\.parquet\.tmp-(\d+)$")  # the guard's run file's (runfile.py)
_SIDECAR = ".json"
_CHUNK = 1 << 20  # bytes read at a time to checksum


class CheckpointFolderError(UserInputError):
    """The checkpoint folder cannot be created or written."""


class CorruptCheckpoint(UserInputError):
    """A checkpoint file fails its checksum or its safe load; the message names it."""


def _temp(path: Path) -> tuple[int, str]:
    # the writer's pid in the name: a start-up clean removes only the temp files of
    # writers that are gone (CheckpointRing.clean)
    return tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp", dir=path.parent)


def _write_durably(path: Path, write: Any) -> str:
    """``write(handle)`` into a temp file, fsync, rename over ``path``; returns its sha256."""
    fd, tmp = _temp(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        digest = _sha256(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return digest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to ``path`` through a temporary file, fsync and rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_durably(path, lambda handle: torch.save(obj, handle))
    fsync_dir(path.parent)
    return path


def sidecar(path: str | os.PathLike) -> Path:
    """The sidecar of checkpoint ``path``: its checksum, size, step and recorded loss."""
    path = Path(path)
    return path.with_name(path.name + _SIDECAR)


def _save_verified(state: dict[str, Any], path: Path) -> None:
    """Checkpoint and sidecar, each durable; the checkpoint's rename comes last."""
    fd, tmp = _temp(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        info = {
            "sha256": _sha256(Path(tmp)),
            "bytes": os.path.getsize(tmp),
            "step": int(state["step"]),
            "loss": _json_float(state.get("loss")),
        }
        text = json.dumps(info, sort_keys=True).encode()
        _write_durably(sidecar(path), lambda handle: handle.write(text))
        try:
            os.replace(tmp, path)
        except BaseException:
            sidecar(path).unlink(missing_ok=True)  # no sidecar without its checkpoint
            raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _json_float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def read_sidecar(path: str | os.PathLike) -> dict[str, Any] | None:
    """The sidecar's fields, or None when it is absent or unreadable."""
    try:
        info = json.loads(sidecar(path).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def verify(path: str | os.PathLike) -> str:
    """Why ``path`` fails its sidecar ("" when it passes, or has no sidecar: older files)."""
    path = Path(path)
    if not sidecar(path).exists():
        return ""
    info = read_sidecar(path)
    if info is None or not isinstance(info.get("sha256"), str):
        return f"its sidecar {sidecar(path).name} is unreadable"
    size = path.stat().st_size
    if size != info.get("bytes"):
        return f"{size} bytes where {info.get('bytes')} were written (truncated or overwritten)"
    if _sha256(path) != info["sha256"]:
        return "its checksum differs from the one recorded when it was written (damaged)"
    return ""


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a guard checkpoint with ``weights_only=True`` and check its format; any
    failure is a :class:`CorruptCheckpoint` that names the file."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's own message suggests weights_only=False: never, for a file that fails here
        raise CorruptCheckpoint(
            f"{path}: refused: it holds pickled objects other than tensors and plain values "
            "(loading it could run code)",
            "a guard checkpoint never does; delete the file or move it out of the folder",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise CorruptCheckpoint(
            f"{path}: unreadable ({type(error).__name__}: {first[:200]})",
            "it was truncated or damaged after it was written; delete it",
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CorruptCheckpoint(
            f"{path}: not a guard checkpoint of format {FORMAT} (got {got!r})",
            "guard checkpoints are written by Guard (guard-<step>.pt)",
        )
    return state


def load_verified(path: str | os.PathLike) -> dict[str, Any]:
    """:func:`verify` (without a sidecar: the zip entries' CRC-32, :func:`_zip_damage`)
    then :func:`load_checkpoint`: a :class:`CorruptCheckpoint` on failure."""
    why = verify(path) or ("" if sidecar(path).exists() else _zip_damage(Path(path)))
    if why:
        raise CorruptCheckpoint(f"{path}: {why}", "delete it; the ring's older ones are intact")
    return load_checkpoint(path)


def _zip_damage(path: Path) -> str:
    """Why ``path``'s zip entries fail their CRC-32 ("" when they pass, or when it is no
    zip: the load says why it is unreadable)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except Exception:  # not a zip (truncated, random bytes): torch.load names it
        return ""
    if bad is None:
        return ""
    return (
        f"its entry {bad} fails its zip checksum (CRC-32): damaged after it was written "
        "(its sidecar is missing, so the file's own sha256 cannot be checked)"
    )


def average_states(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of model state dicts (floating tensors); others from the last."""
    if not states:
        raise ValueError("average_states needs at least one state dict, got none")
    newest = states[-1]
    out: dict[str, torch.Tensor] = {}
    for key, value in newest.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            stacked = torch.stack([s[key].to(torch.float64) for s in states])
            out[key] = stacked.mean(dim=0).to(value.dtype)
        else:  # integer buffers (counters, masks) are not averaged
            out[key] = value
    return out


def _lowest_loss(paths: Sequence[Path]) -> tuple[Path, float] | None:
    """The checkpoint of the lowest recorded loss (its sidecar's) and that loss; None where
    no sidecar records one."""
    known = []
    for path in paths:
        loss = (read_sidecar(path) or {}).get("loss")
        if isinstance(loss, float):
            known.append((loss, path))
    if not known:
        return None
    loss, path = min(known)
    return path, loss


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


class CheckpointRing:
    """The newest ``keep`` healthy checkpoints in ``folder`` (module docstring).

    The ring holds only the files it wrote (or adopted on a resume): checkpoints another
    run left in the folder are never rolled back to, nor deleted, unless a resume adopts
    the folder's lineage (:meth:`adopt`).
    """

    def __init__(self, folder: str | os.PathLike, keep: int = 3) -> None:
        self.folder = Path(folder)
        self.keep = int(keep)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            usable = os.access(self.folder, os.W_OK | os.X_OK)
        except OSError as error:
            usable, why = False, error.strerror or type(error).__name__
        else:
            why = "not writable"
        if not usable:
            raise CheckpointFolderError(
                f"checkpoint_dir {str(self.folder)!r} cannot be created or written ({why})",
                "pass a folder this process may write to, e.g. Guard(..., checkpoint_dir='ckpt')",
            )
        self._mine: list[Path] = []
        self._best: tuple[Path, float] | None = None  # the lowest recorded loss written
        self.unwritten: list[str] = []  # checkpoints a full disk refused (keep.py says so)

    def existing(self) -> list[Path]:
        """Every guard checkpoint in the folder, oldest first (whoever wrote it)."""
        found = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := _NAME.match(p.name))]
        return [p for _, p in sorted(found)]

    def paths(self) -> list[Path]:
        """The ring's files, oldest first."""
        return [p for p in self._mine if p.exists()]

    def clean(self) -> list[str]:
        """Remove what killed writes left (checkpoint and run-file temp files of writers no
        longer running, sidecars whose checkpoint never arrived); returns their names."""
        removed = []
        for path in self.folder.iterdir():
            match = _TEMP.match(path.name) or _RUN_TEMP.match(path.name)
            stale = match is not None and not (match.group(1) and _pid_alive(int(match.group(1))))
            orphan = path.name.endswith(".pt" + _SIDECAR) and not path.with_suffix("").exists()
            if stale or orphan:
                path.unlink(missing_ok=True)
                removed.append(path.name)
        return removed

    def newest_valid(
        self, tidy: bool = True, accept: Callable[[Path, dict[str, Any]], None] | None = None
    ) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
        """The newest checkpoint that passes :func:`load_verified` and ``accept(path,
        state)`` (which raises :class:`CorruptCheckpoint` to refuse it), its state, and one
        line per newer file skipped (``name: why``). With ``tidy`` (one process: DDP's
        rank 0) skipped files are renamed ``<name>.corrupt`` (kept for a look, out of
        every later scan); a file that vanished meanwhile (renamed by rank 0) is skipped."""
        skipped = []
        for path in reversed(self.existing()):
            try:
                state = load_verified(path)
                if accept is not None:
                    accept(path, state)
                return path, state, skipped
            except CorruptCheckpoint as error:
                skipped.append(f"{path.name}: {error.message.split(': ', 1)[-1]}")
            except OSError as error:
                skipped.append(f"{path.name}: {error.strerror or type(error).__name__}")
                continue
            if tidy:
                path.replace(path.with_name(path.name + ".corrupt"))
                sidecar(path).unlink(missing_ok=True)
        return None, None, skipped

    def adopt(self, newest: Path, tidy: bool = True) -> list[str]:
        """Resume: the ring is the folder's checkpoints up to ``newest`` (the last ``keep``)
        and its best is the lowest recorded loss among them all; the other older ones are
        orphans of the run resumed and, with ``tidy``, are removed. Returns their names."""
        older = [p for p in self.existing() if p.name <= Path(newest).name]
        self._mine, self._best = older[-self.keep :], _lowest_loss(older)
        orphans = [p for p in older[: -self.keep] if p != self.best()]
        for path in orphans if tidy else ():
            self._remove(path)
        return [p.name for p in orphans]

    @staticmethod
    def _remove(path: Path) -> None:
        path.unlink(missing_ok=True)
        sidecar(path).unlink(missing_ok=True)

    def path_of(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is (or would be) written."""
        return self.folder / f"guard-{step:09d}.pt"

    def at(self, step: int | None) -> Path | None:
        """The ring's checkpoint of ``step`` (the step a resume from it continues at),
        None where the ring holds none."""
        path = self.path_of(step) if step is not None else None
        return path if path in self.paths() else None

    def save(self, step: int, state: dict[str, Any]) -> Path:
        path = self.path_of(step)
        _save_verified({"format": FORMAT, "step": int(step), **state}, path)
        self._mine = [p for p in self._mine if p != path] + [path]
        stale = self._mine[: -self.keep]
        loss = _json_float(state.get("loss"))
        if loss is not None and (self._best is None or loss < self._best[1]):
            stale += [self._best[0]] if self._best is not None else []
            self._best = (path, loss)
        self._mine = self._mine[-self.keep :]
        for old in stale:  # only after the new one is durable; the best stays
            if old not in self._mine and old != self.best():
                self._remove(old)
        return path

    def origin(self) -> Path:
        """Where the state the guard started from is (``guard-origin.pt``, outside the
        ring's names: never resumed from, averaged or removed by the ring)."""
        return self.folder / ORIGIN

    def save_origin(self, step: int, state: dict[str, Any]) -> Path:
        """Write the state before the guard's first update (a restart's weights)."""
        path = self.origin()
        _save_verified({"format": FORMAT, "step": int(step), **state}, path)
        return path

    def restart(self) -> list[str]:
        """Back to the origin: every checkpoint of the ring, its best too, belongs to a
        trajectory abandoned and is removed; the ring is empty till the next. Returns the
        names removed."""
        gone = [*self._mine, *([self.best()] if self.best() not in (None, *self._mine) else [])]
        for path in gone:
            self._remove(path)
        self._mine, self._best = [], None
        return [p.name for p in gone]

    def best(self) -> Path | None:
        """The checkpoint of the lowest recorded loss the ring wrote, kept after it left
        the ring (a rollback past a ring that trained worse: ``rewind``)."""
        return self._best[0] if self._best is not None else None

    def best_loss(self) -> float:
        """The recorded loss of :meth:`best` (NaN: none)."""
        return self._best[1] if self._best is not None else math.nan

    def rewind(self) -> list[str]:
        """Go back to the best checkpoint: the ring's newer ones belong to a trajectory
        abandoned and are removed (a later rollback or resume must not land on them); the
        ring is the best alone. Returns the names removed."""
        best = self.best()
        gone = [p for p in self._mine if p != best]
        for path in gone:
            self._remove(path)
        self._mine = [best] if best is not None else []
        return [p.name for p in gone]

    def newest(self) -> Path | None:
        paths = self.existing()
        return paths[-1] if paths else None

    def basin(self, max_span: int, max_loss_gap: float) -> list[Path]:
        """The ring's checkpoints that share a basin with the newest, oldest first: those
        within ``max_span`` steps of it whose recorded loss is within ``max_loss_gap``
        (a fraction) of its loss. The newest alone where a loss is unknown."""
        paths = self.paths()
        if not paths:
            return []
        newest = read_sidecar(paths[-1]) or {}
        step, loss = newest.get("step"), newest.get("loss")
        chosen = [paths[-1]]
        for path in reversed(paths[:-1]):
            info = read_sidecar(path) or {}
            near = isinstance(step, int) and isinstance(info.get("step"), int)
            near = near and step - info["step"] <= max_span
            known = isinstance(loss, float) and isinstance(info.get("loss"), float)
            if not (near and known and abs(info["loss"] - loss) <= max_loss_gap * abs(loss)):
                break  # the ones before it lie further still
            chosen.insert(0, path)
        return chosen

    def rollback_state(self, paths: Sequence[str | os.PathLike] | None = None) -> dict[str, Any]:
        """The newest checkpoint's dict with its ``model`` replaced by the mean of ``paths``
        (default: the whole ring), ``averaged`` = how many were averaged. A file that fails
        verification is left out (the newest valid one stands for the ring)."""
        paths = [Path(p) for p in (paths if paths is not None else self.paths())]
        states = []
        for path in paths:
            try:
                states.append(load_verified(path))
            except (CorruptCheckpoint, FileNotFoundError) as error:
                warnings.warn(
                    f"collapse-guard: rollback leaves out {path.name} ({error})",
                    RuntimeWarning,
                    stacklevel=3,
                )
        if not states:
            raise FileNotFoundError(
                f"no healthy checkpoint in {self.folder} to roll back to; the guard writes one "
                "every GuardPolicy.checkpoint_every healthy steps (lower it to have one sooner)"
            )
        newest = dict(states[-1])
        newest["model"] = average_states([s["model"] for s in states])
        newest["averaged"] = len(states)
        return newest
