"""The ring of healthy checkpoints: written atomically, loaded safely, averaged on rollback.

Every file is ``guard-<step>.pt`` in the checkpoint folder, a dict of plain values and
tensors (so ``torch.load(weights_only=True)`` reads it: no pickled code runs on load)::

    {"format": 1, "step": int, "model": state_dict, "optimizer": state_dict,
     "scaler": state_dict | None, "guard": Guard.state_dict()}

Writing: ``torch.save`` into a temporary name in the same folder, fsync, rename over the
final name (atomic on POSIX), fsync the folder: at every instant a file is either whole
or absent. Only healthy steps are written, and only the oldest beyond ``keep`` are
removed, after the new one is durable: the last healthy checkpoints are never lost.

Rollback averages the parameters of the last ``keep`` (3) healthy checkpoints: nearby
points of one trajectory, whose mean lies in the same basin and sits lower in it than
any of them (stochastic weight averaging's argument). The optimizer state is *not*
averaged but taken from the newest: it is a running statistic of the gradients along
the trajectory (Adam's moments with their ``step`` count for bias correction, Lion's
and SGD's momentum), not a point in weight space; a mean of moments of different ages
belongs to no trajectory and would carry three bias corrections at once, while the
newest one is the latest estimate made under healthy training.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from collapse_guard._durable import fsync_dir

__all__ = ["FORMAT", "CheckpointRing", "average_states", "load_checkpoint", "save_atomic"]

FORMAT = 1  # layout of a checkpoint dict; bump when a key changes meaning
_NAME = re.compile(r"^guard-(\d+)\.pt$")


def save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to ``path`` through a temporary file, fsync and rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a guard checkpoint with ``weights_only=True`` and check its format."""
    state = torch.load(Path(path), map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"{path}: not a guard checkpoint of format {FORMAT} (got {got!r}); "
            "guard checkpoints are written by Guard (guard-<step>.pt)"
        )
    return state


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


class CheckpointRing:
    """The newest ``keep`` healthy checkpoints in ``folder`` (module docstring).

    The ring holds only the files it wrote (or adopted on a resume): checkpoints another
    run left in the folder are never rolled back to, nor deleted.
    """

    def __init__(self, folder: str | os.PathLike, keep: int = 3) -> None:
        self.folder = Path(folder)
        self.keep = int(keep)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._mine: list[Path] = []

    def existing(self) -> list[Path]:
        """Every guard checkpoint in the folder, oldest first (whoever wrote it)."""
        found = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := _NAME.match(p.name))]
        return [p for _, p in sorted(found)]

    def paths(self) -> list[Path]:
        """The ring's files, oldest first."""
        return [p for p in self._mine if p.exists()]

    def adopt(self, newest: Path) -> None:
        """Resume: the ring is the folder's checkpoints up to ``newest`` (the last ``keep``)."""
        older = [p for p in self.existing() if p.name <= Path(newest).name]
        self._mine = older[-self.keep :]

    def save(self, step: int, state: dict[str, Any]) -> Path:
        path = self.folder / f"guard-{step:09d}.pt"
        save_atomic({"format": FORMAT, "step": int(step), **state}, path)
        self._mine = [p for p in self._mine if p != path] + [path]
        for old in self._mine[: -self.keep]:  # only after the new one is durable
            old.unlink(missing_ok=True)
        self._mine = self._mine[-self.keep :]
        return path

    def newest(self) -> Path | None:
        paths = self.existing()
        return paths[-1] if paths else None

    def rollback_state(self, paths: Sequence[str | os.PathLike] | None = None) -> dict[str, Any]:
        """The newest checkpoint's dict with its ``model`` replaced by the mean of ``paths``
        (default: the whole ring), ``averaged`` = how many were averaged."""
        paths = [Path(p) for p in (paths if paths is not None else self.paths())]
        if not paths:
            raise FileNotFoundError(
                f"no healthy checkpoint in {self.folder} to roll back to; the guard writes one "
                "every GuardPolicy.checkpoint_every healthy steps (lower it to have one sooner)"
            )
        states = [load_checkpoint(p) for p in paths]
        newest = dict(states[-1])
        newest["model"] = average_states([s["model"] for s in states])
        newest["averaged"] = len(states)
        return newest
