"""Run files brought to the current label rule: ``collapse-guard data relabel``.

A run file stores the ``label_version`` whose rule set its onset (``format.RunMeta``).
When ``label.LABEL_VERSION`` moves, a run labelled under the old rule may carry an onset
the current rule would not find, so training and evaluation refuse it (``records.load_runs``)
until it is relabelled: the onset, kind and spikes found again by ``label.label_run`` on
the file's own rows, written back in place (atomically, through ``writer.write_run``).
A guarded run copied by ``retrain`` keeps its censoring: its kept rows are relabelled.
A run with no label at all (recorded by ``Probe.record_to``, imported without one) is
labelled by the same rule, so that its file carries its onset from then on
(``label.label_unlabelled``). A raw guarded run is left as it is: it is labelled, and
censored, at every read (``runfiles.censoring``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.label import (
    LABEL_VERSION,
    apply_label,
    is_unlabelled,
    label_run,
    label_unlabelled,
)
from collapse_guard.runfiles.reader import read_meta, read_run
from collapse_guard.runfiles.writer import is_compact, write_run

__all__ = ["RelabelReport", "is_stale", "relabel_runs"]


def is_stale(meta: RunMeta) -> bool:
    """Labelled, and under another rule than the current ``LABEL_VERSION``."""
    return meta.label_version is not None and meta.label_version != LABEL_VERSION


@dataclass
class RelabelReport:
    """What one relabelling did: files rewritten (with the onset they had and have now),
    files labelled for the first time (with the onset found)."""

    relabelled: list[tuple[Path, int | None, int | None]] = field(default_factory=list)
    labelled: list[tuple[Path, int | None]] = field(default_factory=list)  # had no label
    current: list[Path] = field(default_factory=list)  # labelled under LABEL_VERSION already
    skipped: list[Path] = field(default_factory=list)  # raw guarded, or no loss to label by

    @property
    def changed(self) -> int:
        """Relabelled runs whose onset moved."""
        return sum(old != new for _, old, new in self.relabelled)


def relabel_runs(paths: Iterable[str | Path], *, dry_run: bool = False) -> RelabelReport:
    """Relabel every run file in ``paths`` that ``is_stale`` and label every one that has
    no label (``label.is_unlabelled``), in place unless ``dry_run``."""
    report = RelabelReport()
    for path in map(Path, paths):
        meta = read_meta(path)  # the footer only: current runs are never read whole
        if meta.source == "guarded" and "censoring" not in meta.extra:
            report.skipped.append(path)  # labelled and censored at every read
            continue
        if not (is_stale(meta) or is_unlabelled(meta)):
            (report.current if meta.label_version else report.skipped).append(path)
            continue
        frame, meta = read_run(path)
        if is_stale(meta):
            fresh = apply_label(meta, label_run(frame))
            report.relabelled.append((path, meta.onset_step, fresh.onset_step))
        else:
            fresh, labelled_now = label_unlabelled(frame, meta)
            if not labelled_now:
                report.skipped.append(path)
                continue
            report.labelled.append((path, fresh.onset_step))
        if not dry_run:
            write_run(path, frame, fresh, compact=is_compact(path))  # a compact file stays compact
    return report
