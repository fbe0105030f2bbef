"""New run files into the dataset folder: found anywhere fsspec reaches, checked, labelled, kept.

``--runs`` names folders, files or fsspec URLs (``file:///data/runs``, ``s3://bucket/runs``,
``memory://runs`` in tests); a folder is searched recursively for ``*.parquet``. Each
file is copied to a local staging file, read with the run-file reader's checks and:

==========================  ===============================================================
found                       what happens
==========================  ===============================================================
damaged, foreign, newer     rejected, by name, with the reader's reason
schema, no steps
guarded run not closed      rejected: the guard writes its summary at ``close()``; until
                            then the file may still grow
guarded run                 a rescue is a caught collapse: the rows up to it kept,
                            labelled collapsing; otherwise labelled on its steps before
                            the guard's first intervention (skips of one outlier batch,
                            QK-clips and checkpoints are none), later rows censored
                            (``runfiles.censoring``)
unlabelled run              labelled (``runfiles.label``)
run id already in the       skipped as already ingested when it came from the same bytes
dataset                     (a rerun after a crash); rejected when the bytes differ
==========================  ===============================================================

An accepted run is written to ``<base>/ingested/<run id>.parquet`` (atomically, by the
run-file writer) with ``extra["ingest"]``: where it came from and the SHA-256 of its
bytes. Nothing is silently dropped: every file found is in the report, as ingested,
already there, rejected (with the reason) or ignored (not ``*.parquet`` in a folder).
:func:`discard_ingested` takes back what one ingest wrote (a retrain that failed before
anything refers to its copies leaves no file behind).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from collapse_guard.runfiles.censoring import Censoring, censor_guarded
from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.label import HORIZON, apply_label, label_run
from collapse_guard.runfiles.reader import list_runs, read_meta, read_run
from collapse_guard.runfiles.writer import write_run

__all__ = [
    "INGESTED_FOLDER",
    "Dataset",
    "IngestReport",
    "Ingested",
    "Rejected",
    "dataset_runs",
    "discard_ingested",
    "find_run_urls",
    "ingest_runs",
]

INGESTED_FOLDER = "ingested"  # under the dataset folder: where accepted runs are written
_SUFFIX = ".parquet"


@dataclass(frozen=True)
class Rejected:
    """A file that was not ingested, and why (one line: what was expected, what to do)."""

    name: str
    reason: str


@dataclass(frozen=True)
class Ingested:
    """A run now in the dataset folder."""

    name: str  # as found (path or URL)
    run_id: str
    path: Path  # its copy in the dataset folder
    censoring: Censoring | None = None  # guarded runs only


@dataclass
class IngestReport:
    """Every file found under ``--runs``, by outcome."""

    ingested: list[Ingested] = field(default_factory=list)  # written now
    already: list[Ingested] = field(default_factory=list)  # written by an earlier attempt
    rejected: list[Rejected] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # not *.parquet, in a folder

    @property
    def run_ids(self) -> list[str]:
        """The new runs of this retrain: ingested now or by an interrupted earlier attempt."""
        return sorted(r.run_id for r in (*self.ingested, *self.already))


def _fs(source: str):
    import fsspec

    return fsspec.core.url_to_fs(source)


def _display(fs, path: str, source: str) -> str:
    # plain paths stay plain; URLs keep their protocol, as the user wrote them
    return fs.unstrip_protocol(path) if "://" in source else path


def find_run_urls(sources: Sequence[str]) -> tuple[list[tuple[str, str]], IngestReport]:
    """``(name, url)`` of every run file under ``sources``, and a report of what was not one.

    A missing source is rejected by name; files in a folder that are not ``*.parquet``
    (checkpoints, forensics) are listed as ignored; a hidden file (``.name``: a writer's
    temporary file) is neither.
    """
    found: dict[str, str] = {}
    report = IngestReport()
    for source in sources:
        fs, root = _fs(str(source))
        if fs.isdir(root):
            for path in sorted(fs.find(root)):
                name = _display(fs, path, str(source))
                if Path(path).name.startswith("."):
                    continue
                if path.endswith(_SUFFIX):
                    found[name] = fs.unstrip_protocol(path)
                else:
                    report.ignored.append(name)
        elif fs.isfile(root):
            found[_display(fs, root, str(source))] = fs.unstrip_protocol(root)
        else:
            report.rejected.append(
                Rejected(str(source), "no such file or folder: expected run files (*.parquet)")
            )
    return sorted(found.items()), report


@dataclass(frozen=True)
class Dataset:
    """Every readable run under a dataset folder, by run id, its footer read once here."""

    paths: dict[str, Path]
    metas: dict[str, RunMeta]
    unreadable: list[Rejected]  # files whose footer cannot be read, or a second run id


def dataset_runs(base: Path) -> Dataset:
    """The runs of the dataset folder ``base`` (footers only; unreadable files apart).

    Two files with one run id: the second is reported, not used.
    """
    paths: dict[str, Path] = {}
    metas: dict[str, RunMeta] = {}
    bad: list[Rejected] = []
    for path in list_runs(base) if base.is_dir() else []:
        try:
            meta = read_meta(path)
        except (ValueError, OSError) as error:
            bad.append(Rejected(str(path), str(error)))
            continue
        if meta.run_id in paths:
            bad.append(
                Rejected(str(path), f"run id {meta.run_id!r} is also in {paths[meta.run_id]}")
            )
            continue
        paths[meta.run_id], metas[meta.run_id] = path, meta
    return Dataset(paths, metas, bad)


def _file_name(run_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)
    if safe != run_id:  # two ids must not map to one file
        safe += "-" + hashlib.sha256(run_id.encode()).hexdigest()[:8]
    return safe + _SUFFIX


def _prepare(frame, meta: RunMeta, horizon: int):
    """Label (and censor a guarded run); returns (frame, meta, censoring) or a reason."""
    if frame.empty:
        return "the run has no steps: expected at least one recorded step"
    if meta.source == "guarded":
        if "guard" not in meta.extra:
            return (
                "guarded run without the guard's closing summary (extra['guard']): the guard "
                "may still be writing it; ingest it after guard.close()"
            )
        frame, meta, censoring = censor_guarded(frame, meta, horizon=horizon)
        if frame.empty:
            return (
                f"no step has a known outcome: the guard first changed the run's course at "
                f"step {censoring.first_intervention} ({censoring.rows_before} rows), within "
                "a horizon of its start and with no rescue to say how it ended"
            )
        return frame, meta, censoring
    if meta.label_version is None:
        if not frame["loss"].notna().any():
            return "unlabelled run without loss values: the label needs the loss"
        meta = apply_label(meta, label_run(frame))
    return frame, meta, None


def _stage(url: str, folder: Path) -> tuple[Path, str]:
    """Copy ``url`` to a local file; returns it and the SHA-256 of its bytes."""
    import fsspec

    local = folder / "staged.parquet"
    with fsspec.open(url, "rb") as src, local.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return local, _sha256(local)


def _ingest_one(
    name: str,
    url: str,
    target: Path,
    known: dict[str, Path],
    report: IngestReport,
    horizon: int,
) -> None:
    with tempfile.TemporaryDirectory(prefix="collapse-guard-ingest-") as tmp:
        try:
            local, sha = _stage(url, Path(tmp))
            frame, meta = read_run(local)
        except (ValueError, OSError) as error:
            # the reader names its (staging) file: name the file the user gave instead
            reason = str(error).replace(str(Path(tmp) / "staged.parquet"), name)
            report.rejected.append(Rejected(name, reason))
            return
    if meta.run_id in known:
        _known_run(name, meta.run_id, known[meta.run_id], sha, report)
        return
    prepared = _prepare(frame, meta, horizon)
    if isinstance(prepared, str):
        report.rejected.append(Rejected(name, prepared))
        return
    frame, meta, censoring = prepared
    meta = replace(meta, extra={**meta.extra, "ingest": {"source": name, "sha256": sha}})
    path = write_run(target / _file_name(meta.run_id), frame, meta)
    known[meta.run_id] = path
    report.ingested.append(Ingested(name, meta.run_id, path, censoring))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _known_run(name: str, run_id: str, path: Path, sha: str, report: IngestReport) -> None:
    meta = read_meta(path)
    # an ingested copy records its source's bytes; a file put there by hand is its bytes
    known = meta.extra.get("ingest", {}).get("sha256") or _sha256(path)
    if known == sha:
        censoring = meta.extra.get("censoring")
        report.already.append(
            Ingested(name, run_id, path, Censoring(**censoring) if censoring else None)
        )
        return
    report.rejected.append(
        Rejected(
            name,
            f"run id {run_id!r} is already in the dataset ({path}) with other data; "
            "give the new run its own run_id, or delete the old file to replace it",
        )
    )


def ingest_runs(
    sources: Iterable[str | Path], base: str | Path, *, horizon: int = HORIZON
) -> IngestReport:
    """Check, label and copy the run files under ``sources`` into ``<base>/ingested/``.

    Idempotent: a file ingested before (same run id, same bytes) is reported under
    ``already`` and not written again.
    """
    base = Path(base)
    pairs, report = find_run_urls([str(s) for s in sources])
    known = dataset_runs(base).paths
    target = base / INGESTED_FOLDER
    for name, url in pairs:
        _ingest_one(name, url, target, known, report, horizon)
    return report


def discard_ingested(report: IngestReport, base: str | Path) -> None:
    """Delete the copies ``report`` wrote now (not those of an earlier attempt), and
    ``<base>/ingested/`` itself when that leaves it empty."""
    for item in report.ingested:
        item.path.unlink(missing_ok=True)
    folder = Path(base) / INGESTED_FOLDER
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
