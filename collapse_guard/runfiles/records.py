"""Run files as training and evaluation read them: found, censored, checked, held or lazy.

``find_run_files`` turns folders and files into run files; ``load_runs`` reads each once,
labels and censors a guarded run (``as_training_run``), refuses duplicate run ids, runs
whose steps do not strictly increase (``check_steps``: a file no ``RunWriter`` wrote) and
runs labelled under an older label rule (``collapse-guard data relabel`` brings them to
the current one) and returns :class:`RunRecord`s; ``label_unlabelled_runs`` labels, in
memory, the runs that carry no label (a probe's recordings: ``predict`` and ``evaluate``
show their lead times); ``data_fingerprint`` names the labelled
runs a training saw, ``content_fingerprint`` what one run holds (its steps and signals,
whatever its run id: two runs with the same one are copies).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from collapse_guard.errors import UserInputError
from collapse_guard.runfiles.censoring import censor_guarded
from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.label import LABEL_VERSION, label_unlabelled
from collapse_guard.runfiles.reader import list_runs, read_run
from collapse_guard.runfiles.relabel import is_stale
from collapse_guard.signals import SIGNAL_NAMES

__all__ = [
    "RunRecord",
    "as_training_run",
    "check_steps",
    "content_fingerprint",
    "data_fingerprint",
    "find_run_files",
    "label_unlabelled_runs",
    "load_runs",
    "run_label",
]

# What a folder without run files gets told, unless the command knows better
_MAKE_RUNS = "make some with `collapse-guard data synth` or `collapse-guard data real`"


class RunRecord:
    """One run: its frame (``step`` + signal columns) and its metadata.

    ``RunRecord(frame, meta, path)`` holds the frame; :meth:`stored` holds only the
    metadata and reads the frame from ``path`` at each access (``load_runs(...,
    lazy=True)``): a training of thousands of runs then holds their metadata, not their
    frames (benchmarks/README.md, "training memory"). The frame read is the one
    ``load_runs`` checked (``as_training_run``: a raw guarded run censored again, the
    same way).
    """

    __slots__ = ("_frame", "_rows", "meta", "path")

    def __init__(self, frame: pd.DataFrame | None, meta: RunMeta, path: Path | None = None):
        if frame is None and path is None:
            raise ValueError("a RunRecord needs its frame or the path to read it from")
        self._frame, self.meta, self.path = frame, meta, path
        self._rows = None if frame is None else len(frame)

    @classmethod
    def stored(cls, meta: RunMeta, path: Path, rows: int) -> RunRecord:
        """A record whose frame (``rows`` rows) is read from ``path`` when asked for."""
        record = cls(None, meta, Path(path))
        record._rows = int(rows)
        return record

    @property
    def frame(self) -> pd.DataFrame:
        if self._frame is not None:
            return self._frame
        return as_training_run(*read_run(self.path))[0]

    @property
    def held(self) -> RunRecord:
        """The same run with its frame in memory (itself when it holds it already)."""
        return self if self._frame is not None else RunRecord(self.frame, self.meta, self.path)

    @property
    def n_rows(self) -> int:
        """Rows of the frame, without reading it."""
        return self._rows

    @property
    def run_id(self) -> str:
        return self.meta.run_id

    @property
    def collapsed(self) -> bool:
        return self.meta.onset_step is not None

    def __repr__(self) -> str:
        where = "held" if self._frame is not None else f"read from {self.path}"
        return f"RunRecord({self.run_id!r}, {self.n_rows} rows, {where})"


def find_run_files(sources: Iterable[str | Path], *, empty_hint: str = _MAKE_RUNS) -> list[Path]:
    """Run files under the given folders (recursively) and files, sorted, each once.

    A folder without any ``*.parquet`` or a path that does not exist is a
    :class:`UserInputError` that says what was expected (never an empty training set);
    ``empty_hint``: what the command's user should do about an empty folder (training
    makes runs with ``data synth``; calibration needs the user's own healthy runs).
    """
    paths: set[Path] = set()
    for source in map(Path, sources):
        if source.is_dir():
            found = list_runs(source)
            if not found:
                raise UserInputError(
                    f"no runs found under {source}: expected *.parquet run files", empty_hint
                )
            paths.update(found)
        elif source.is_file():
            paths.add(source)
        else:
            raise UserInputError(
                f"{source} does not exist: expected a folder of run files or a run file"
            )
    return sorted(paths)


def as_training_run(frame: pd.DataFrame, meta: RunMeta) -> tuple[pd.DataFrame, RunMeta]:
    """A run as training and evaluation may read it: a guarded run labelled and censored.

    The guard writes its runs unlabelled and keeps acting on them; read raw, every row of a
    guarded run would count as healthy, also after an intervention that may have averted a
    collapse (``runfiles.censoring`` says which rows keep a known outcome). A copy that
    ``retrain`` ingested is censored already (``extra["censoring"]``) and passes as it is.
    """
    if meta.source != "guarded" or "censoring" in meta.extra:
        return frame, meta
    kept, labelled, _ = censor_guarded(frame, meta)
    return kept, labelled


def load_runs(paths: Iterable[str | Path], *, lazy: bool = False) -> list[RunRecord]:
    """Read run files; duplicate run ids are an error (they would defeat the split).

    ``lazy``: each file is read and checked here, then only its metadata is kept
    (``RunRecord.stored``: the frame is read again at each access)."""
    records: list[RunRecord] = []
    seen: dict[str, Path] = {}
    for path in paths:
        path = Path(path)
        raw, meta = read_run(path)
        check_steps(raw, f"{path} (run {meta.run_id!r})")  # before censoring labels it
        frame, meta = as_training_run(raw, meta)
        _refuse_stale_label(path, meta)
        if meta.run_id in seen:
            raise UserInputError(  # a ValueError, as before: now one line on the CLI
                f"run id {meta.run_id!r} appears in both {seen[meta.run_id]} and {path}; "
                "run ids must be unique so that no run lands in two splits",
                "drop the duplicate file or give it its own run_id",
            )
        seen[meta.run_id] = path
        records.append(
            RunRecord.stored(meta, path, len(frame)) if lazy else RunRecord(frame, meta, path)
        )
    return records


def run_label(frame: pd.DataFrame, meta: RunMeta) -> tuple[RunMeta, bool]:
    """``(meta, labelled_now)``: the run's metadata with its label, and whether the label was
    found now because the file carries none: a raw guarded run's on the steps before the
    guard first acted (``as_training_run``), any other run's by ``label_run`` on its rows
    (``label.label_unlabelled``). A run recorded by ``Probe.record_to`` has no onset; read as
    it is, a collapse there would pass for a healthy run and its alarms for false ones."""
    _, labelled = as_training_run(frame, meta)
    if labelled is not meta:
        return labelled, True
    return label_unlabelled(frame, meta)


def label_unlabelled_runs(records: Iterable[RunRecord]) -> tuple[list[RunRecord], list[str]]:
    """The records with every run that carries no label labelled (``run_label``), in
    memory (``collapse-guard data relabel`` writes labels into the files), and the ids of
    the runs labelled now."""
    out, labelled = [], []
    for record in records:
        meta, now = run_label(record.frame, record.meta)
        if now:
            labelled.append(record.run_id)
            record = RunRecord(record.frame, meta, record.path)
        out.append(record)
    return out, labelled


def check_steps(frame: pd.DataFrame, where: str) -> None:
    """Refuse a run whose steps do not strictly increase, naming ``where`` and the first
    bad row (a :class:`UserInputError`). A ``RunWriter`` and ``write_run`` never write one;
    a file made otherwise can hold a step twice or a step that goes back, which the label
    and the features refuse further down with less to go on."""
    if "step" not in frame.columns:
        raise UserInputError(
            f"{where}: no 'step' column; a run holds one row per training step",
            "add a 'step' column (the int training step of each row)",
        )
    steps = frame["step"].to_numpy()
    if steps.size < 2:
        return
    bad = np.flatnonzero(steps[1:] <= steps[:-1])  # not np.diff: unsigned steps wrap
    if bad.size:
        row = int(bad[0]) + 1
        got, before = steps[row], steps[row - 1]
        what = "repeats" if got == before else "goes back from"
        raise UserInputError(
            f"{where}: steps must strictly increase; row {row} has step {got}, which "
            f"{what} step {before} of row {row - 1} ({bad.size} row(s) out of order in all)",
            "write the run again with its rows sorted by step, one row per step "
            "(frame.sort_values('step').drop_duplicates('step', keep='last'))",
        )


def content_fingerprint(frame: pd.DataFrame) -> str:
    """Short hash of a run's steps and signal values: what it holds, not what it is called.

    Two runs with the same one are copies of each other whatever their run ids, files or
    metadata (the ``event`` column and the metadata are left out). A signal the frame lacks
    counts as unmeasured (NaN), as the reader gives it; every NaN hashes alike.
    """
    digest = hashlib.sha256()
    steps = np.ascontiguousarray(frame["step"].to_numpy(), dtype=np.int64)
    digest.update(steps.tobytes())
    for name in SIGNAL_NAMES:
        if name in frame.columns:
            values = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=np.float64)
            values = np.where(np.isnan(values), np.nan, values)  # one NaN bit pattern
        else:
            values = np.full(len(frame), np.nan)
        digest.update(name.encode("utf-8") + b"\0")
        digest.update(np.ascontiguousarray(values).tobytes())
    return digest.hexdigest()[:16]


def _refuse_stale_label(path: Path, meta: RunMeta) -> None:
    # an onset set by an older rule may not be the one the current rule finds: trained or
    # graded on, it would teach or score the model against a label nobody uses any more
    if is_stale(meta):
        raise UserInputError(
            f"{path}: labelled under label rule {meta.label_version!r}, the current rule is "
            f"{LABEL_VERSION!r}; its onset may not be the one the current rule finds",
            f"relabel the runs first: collapse-guard data relabel --runs {path.parent}",
        )


def data_fingerprint(runs: Iterable[RunRecord]) -> str:
    """Short hash of the runs' ids, sources, labels and lengths (order-independent).

    The one fingerprint of a training's data (the model's ``data_fingerprint``, the MLflow
    tag, the bundled model's version): two trainings with the same one saw the same
    labelled runs; a relabelled or regrown run changes it.
    """
    keys = sorted(
        f"{r.run_id}|{r.meta.source}|{r.meta.onset_step}|{r.meta.label_version}|{r.n_rows}"
        for r in runs
    )
    return hashlib.sha256("\n".join(keys).encode("utf-8")).hexdigest()[:16]
