"""The runs :func:`~collapse_guard.predictor.core.recalibrate.calibrate` sets levels on:
read from whatever the user hands it, and refused where no healthy step can come from them.

Refused, each kind in one error naming the runs: a run with no rows, a run whose steps do
not strictly increase (``runfiles.records.check_steps``), a copy of another calibration run
(the same ``runfiles.records.content_fingerprint``: its steps would be counted twice), a run
that collapsed (labelled here by ``runfiles.label`` if it carries no label), and a run the
model trained on (its risks are what the model learned, not what a new run gives).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core.seen_runs import SeenRuns
from collapse_guard.runfiles import RunMeta
from collapse_guard.runfiles.label import label_run
from collapse_guard.runfiles.records import (
    RunRecord,
    check_steps,
    content_fingerprint,
    find_run_files,
    load_runs,
)

__all__ = ["RunsLike", "calibration_records", "refuse_unfit"]


RunsLike = Iterable[str | Path | RunRecord | pd.DataFrame] | Mapping[str, pd.DataFrame]


def calibration_records(runs: RunsLike) -> list[RunRecord]:
    """Run files, folders of them, ``RunRecord``s, frames (``attrs["run_id"]`` names one), or
    ``{run_id: frame}``, as records (frames get a meta with no label: they are labelled)."""
    if isinstance(runs, Mapping):
        return [
            RunRecord(frame, RunMeta(str(run_id), "imported")) for run_id, frame in runs.items()
        ]
    records, paths = [], []
    for i, item in enumerate(runs):
        if isinstance(item, RunRecord):
            records.append(item)
        elif isinstance(item, pd.DataFrame):
            run_id = str(item.attrs.get("run_id") or f"frame-{i}")
            records.append(RunRecord(item, RunMeta(run_id, "imported")))
        else:
            paths.append(item)
    return records + (load_runs(find_run_files(paths)) if paths else [])


def _named(record: RunRecord) -> str:
    return f"{record.run_id} ({record.path})" if record.path is not None else record.run_id


def _why_empty(record: RunRecord) -> str:
    censoring = record.meta.extra.get("censoring") or {}
    if censoring.get("rows_before"):  # a guarded run: its rows after the guard acted are out
        return (
            f"{_named(record)}: all {censoring['rows_before']} rows censored, the guard first "
            f"acted at step {censoring.get('first_intervention')}"
        )
    return _named(record)


def _refuse_empty(records: Sequence[RunRecord]) -> None:
    empty = [r for r in records if r.n_rows == 0]
    if empty:
        named = ", ".join(_why_empty(r) for r in empty[:5])
        raise UserInputError(
            f"{len(empty)} of {len(records)} calibration runs have no rows: {named}",
            "a run gives healthy steps through its rows only; remove the empty runs "
            "(or calibrate once they have trained)",
        )


def _refuse_copies(records: Sequence[RunRecord]) -> None:
    # a copy is no new healthy step: counted, it would certify budgets that one run cannot
    first: dict[str, RunRecord] = {}
    copies: list[tuple[RunRecord, RunRecord]] = []
    for record in records:
        original = first.setdefault(content_fingerprint(record.frame), record)
        if original is not record:
            copies.append((record, original))
    if copies:
        named = ", ".join(f"{_named(c)} is a copy of {_named(o)}" for c, o in copies[:5])
        raise UserInputError(
            f"{len(copies)} of {len(records)} calibration runs hold the same steps and signals "
            f"as another (the same content fingerprint): {named}",
            "remove the copy (keep one file of each run): its steps are no new healthy steps",
        )


def _refuse_unusable(records: Sequence[RunRecord]) -> None:
    """Runs no healthy step can come from: empty, steps out of order, copies."""
    _refuse_empty(records)
    for record in records:  # files were checked as read, before censoring; frames here
        check_steps(record.frame, f"calibration run {_named(record)}")
    _refuse_copies(records)


def _onset(record: RunRecord) -> int | None:
    if record.meta.onset_step is not None or record.meta.label_version is not None:
        return record.meta.onset_step
    return label_run(record.frame).onset_step  # unlabelled (a probe's or a guard's run)


def _refuse_collapsed(records: Sequence[RunRecord]) -> None:
    collapsed = [(r.run_id, step) for r in records if (step := _onset(r)) is not None]
    if collapsed:
        named = ", ".join(f"{run_id} (onset at step {step})" for run_id, step in collapsed[:5])
        raise UserInputError(
            f"{len(collapsed)} of {len(records)} calibration runs collapsed: {named}",
            "calibrate sets false-alarm levels on healthy runs only; pass runs that trained "
            "to their end without collapsing",
        )


def _refuse_trained_on(model: Any, records: Sequence[RunRecord]) -> None:
    seen = SeenRuns.from_meta(model.meta)
    known = [r.run_id for r in records if seen.role_of(r.run_id) == "train"]
    if known:
        raise UserInputError(
            f"{len(known)} of {len(records)} calibration runs are among the runs model "
            f"{model.meta['version']} was trained on: {', '.join(known[:5])}",
            "calibrate on runs of your own set-up that the model never trained on; its risks "
            "on its own training runs are what it learned, not what a new run gives",
        )


def refuse_unfit(model: Any, records: Sequence[RunRecord]) -> None:
    """Refuse, in one :class:`UserInputError` each kind, runs no level may be set on
    (module docstring); ``model``: a ``RiskModel`` (its meta names its training runs)."""
    _refuse_unusable(records)
    _refuse_collapsed(records)
    _refuse_trained_on(model, records)
