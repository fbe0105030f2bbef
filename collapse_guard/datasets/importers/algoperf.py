"""MLCommons AlgoPerf trial logs: ``measurements.csv`` beside an optional ``hparams.json``.

The path names the trial:
``.../logs/<ruleset>/<submission>/<study>/<workload>_<framework>/<trial>/measurements.csv``.
Train rows carry ``global_step``, ``loss`` (the minibatch training loss, logged every
100 steps by the harness), ``grad_norm`` and sometimes ``lr``; eval rows carry only
eval metrics and are not rows of the run. Trials whose file has no ``loss`` column
(most self-tuning submissions log eval metrics only) have no training curve to import.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from collapse_guard.datasets.importers.common import (
    NothingToImport,
    ParsedRun,
    frames_from_table,
    piece_part,
    read_head,
)

__all__ = ["NAME", "parse", "sniff", "trial_info"]

NAME = "algoperf"
_FILE = "measurements.csv"
# canonical name -> AlgoPerf column
_COLUMNS = {"step": "global_step", "loss": "loss", "grad_norm": "grad_norm", "lr": "lr"}
_FRAMEWORKS = ("jax", "pytorch")
_VERSION = re.compile(r"algoperf_v\d+")


def sniff(path: Path) -> bool:
    """``measurements.csv`` with a ``global_step`` column (the harness's own layout)."""
    if path.name != _FILE:
        return False
    header = read_head(path, 4096).split("\n", 1)[0]
    return "global_step" in header.split(",")


def trial_info(path: Path) -> dict[str, str]:
    """workload, framework, trial, study, submission, ruleset, version read from the path."""
    parts = path.parent.parts
    info: dict[str, str] = {}
    if len(parts) >= 5:
        info["trial"] = parts[-1]
        workload, _, framework = parts[-2].rpartition("_")
        if framework in _FRAMEWORKS:
            info["workload"], info["framework"] = workload, framework
        else:
            info["workload"] = parts[-2]
        info["study"], info["submission"], info["ruleset"] = parts[-3], parts[-4], parts[-5]
    version = next((p for p in reversed(parts) if _VERSION.fullmatch(p)), None)
    if version:
        info["version"] = version
    return info


def parse(path: Path) -> list[ParsedRun]:
    """One run: the logged train steps, config from ``hparams.json`` when present."""
    header = read_head(path, 4096).split("\n", 1)[0].strip().split(",")
    if "loss" not in header:
        raise NothingToImport(
            f"{path}: expected a 'loss' column (per-step training loss), got only "
            f"{', '.join(h for h in header if '/' in h)[:120]}...; nothing to import "
            "(eval-only measurements)"
        )
    cols = {canon: col for canon, col in _COLUMNS.items() if col in header}
    table = pd.read_csv(path, dtype=str, keep_default_na=False, usecols=list(cols.values()))
    hparams = path.parent / "hparams.json"
    config = json.loads(hparams.read_text()) if hparams.is_file() else {}
    frames = frames_from_table(path, table, cols)
    info = trial_info(path)
    return [
        ParsedRun(frame, part=piece_part("", i), config=dict(config), extra=dict(info))
        for i, frame in enumerate(frames, start=1)
    ]
