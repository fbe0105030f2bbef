"""<RECORD>: the guarded run's run file (source "guarded") and what the guard did.

A row per step (the probe's record, with the step's events ``;``-joined in ``event``),
written by the probe's writer; at close its metadata gets the guard's summary, its
last events and, for a resumed run, the run it continues.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collapse_guard.guard.policy import GuardPolicy

__all__ = ["CLOSE_EVENTS", "close_extra", "open_run_writer"]

CLOSE_EVENTS = 1000  # the last events the run file's metadata keeps


def open_run_writer(folder: Path, run_id: str, policy: GuardPolicy, optimizer: Any) -> Any:
    """The writer of ``folder/run-<run_id>.parquet``; a write the disk refuses keeps its
    rows in memory and warns once (``keep_on_error``: the loop never stops for the disk)."""
    from collapse_guard.runfiles import RunMeta  # pandas, pyarrow: lazily
    from collapse_guard.runfiles.writer import RunWriter

    config = {"policy": policy.to_dict(), "optimizer": type(optimizer).__name__}
    meta = RunMeta(run_id=run_id, source="guarded", config=config)
    return RunWriter(folder / f"run-{run_id}.parquet", meta, keep_on_error=True)


def close_extra(
    summary: dict[str, Any], events: list[tuple[int, str]], continues: dict[str, Any] | None
) -> dict[str, Any]:
    """The run file's ``extra`` at close."""
    extra: dict[str, Any] = {
        "guard": {**summary, "events": [f"{s}:{e}" for s, e in events[-CLOSE_EVENTS:]]}
    }
    if continues is not None:
        extra["continues"] = continues
    return extra
