"""``collapse-guard data relabel``: run files labelled under an older rule brought to the
current one, and run files with no label (a probe's recordings) labelled by it
(``runfiles.relabel``); the library is imported inside, so ``--help`` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["relabel_command"]


def relabel_command(
    runs: Annotated[
        list[Path],
        typer.Option(
            "--runs", help="Folders of run files (searched recursively) or run files to relabel."
        ),
    ],
    dry_run: Annotated[bool, typer.Option(help="Say what would change; write nothing.")] = False,
) -> None:
    """Relabel runs whose label_version is not the current rule's, and label runs that
    carry no label (recorded by Probe.record_to), in place."""
    from rich.console import Console

    from collapse_guard.runfiles.label import RULE_NAME
    from collapse_guard.runfiles.records import find_run_files
    from collapse_guard.runfiles.relabel import relabel_runs

    console = Console()
    report = relabel_runs(find_run_files(runs), dry_run=dry_run)
    relabel, label = ("would relabel", "would label") if dry_run else ("relabelled", "labelled")
    for path, old, new in report.relabelled:
        moved = "" if old == new else f": onset {old} -> {new}"
        console.print(f"{relabel} {path}{moved}", soft_wrap=True)
    for path, onset in report.labelled:
        found = "healthy" if onset is None else f"onset {onset}"
        console.print(f"{label} {path}: {found}", soft_wrap=True)
    console.print(
        f"{len(report.relabelled)} run(s) {'to relabel' if dry_run else 'relabelled'} "
        f"({report.changed} onset(s) moved) and {len(report.labelled)} unlabelled run(s) "
        f"{'to label' if dry_run else 'labelled'}, by {RULE_NAME}; {len(report.current)} "
        f"already current, {len(report.skipped)} raw guarded or without a loss left as they are",
        soft_wrap=True,
    )
