"""A resumed run's files: which continue which, and a crash's rows that no longer stand.

A run resumed from a checkpoint records into a new file whose metadata names the run it
continues (``extra["continues"]``: run_id, step, checkpoint): the files end to end are the
run. After a crash the resume trains again from the checkpoint's weights, so the rows the
run (or a run that continued it) recorded after that step belong to a history that was
thrown away. :func:`cut_after` takes them out of the run's file and
:func:`supersede` moves a whole file of them aside (``*.parquet.superseded``: kept for
forensics, no longer a run file), so that the folder holds every step once.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.reader import read_meta, read_run
from collapse_guard.runfiles.writer import is_compact, write_run

__all__ = ["SUPERSEDED", "continuing", "cut_after", "run_files", "supersede"]

SUPERSEDED = ".superseded"  # the suffix of a file of rows no longer the run's


def run_files(
    folder: str | os.PathLike, pattern: str = "run-*.parquet"
) -> dict[str, tuple[Path, RunMeta]]:
    """run_id -> (file, metadata) of the readable run files matching ``pattern`` in
    ``folder`` (a damaged or foreign file is no run's record: left out)."""
    found: dict[str, tuple[Path, RunMeta]] = {}
    for file in Path(folder).glob(pattern):
        try:
            meta = read_meta(file)
        except Exception:  # whatever it is, it records no run of ours
            continue
        found[meta.run_id] = (file, meta)
    return found


def continuing(runs: dict[str, tuple[Path, RunMeta]], run_id: str) -> set[str]:
    """The runs among ``runs`` that continue ``run_id``, and those that continue them."""
    parent = {
        rid: (meta.extra.get("continues") or {}).get("run_id") for rid, (_, meta) in runs.items()
    }
    lineage: set[str] = {run_id}
    while more := {rid for rid, of in parent.items() if of in lineage} - lineage:
        lineage |= more
    return lineage - {run_id}


def cut_after(path: Path, step: int, why: str) -> list[int]:
    """Rewrite the run file at ``path`` without its rows at ``step`` or later (durably, as
    compact as it was), noting ``why`` in its metadata; returns the steps taken out."""
    frame, meta = read_run(path)
    late = frame["step"] >= step
    if not late.any():
        return []
    cuts = [*meta.extra.get("cut", []), {"from_step": int(step), "why": why}]
    kept = dataclasses.replace(meta, extra={**meta.extra, "cut": cuts})
    write_run(path, frame[~late], kept, compact=is_compact(path))
    return frame.loc[late, "step"].astype(int).tolist()


def supersede(path: Path) -> Path:
    """Move a run file aside as ``<name>.superseded`` (no reader lists it); its new path."""
    target = path.with_name(path.name + SUPERSEDED)
    os.replace(path, target)
    return target
