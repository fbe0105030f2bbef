"""``collapse-guard data relabel``: run files labelled under an older rule brought to the
current one (``runfiles.relabel``); the library is imported inside, so ``--help`` stays fast."""

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
    """Relabel runs whose label_version is not the current rule's, in place."""
    from rich.console import Console

    from collapse_guard.runfiles.label import LABEL_VERSION
    from collapse_guard.runfiles.records import find_run_files
    from collapse_guard.runfiles.relabel import relabel_runs

    console = Console()
    report = relabel_runs(find_run_files(runs), dry_run=dry_run)
    for path, old, new in report.relabelled:
        moved = "" if old == new else f": onset {old} -> {new}"
        console.print(
            f"{'would relabel' if dry_run else 'relabelled'} {path}{moved}", soft_wrap=True
        )
    console.print(
        f"{len(report.relabelled)} run(s) {'to relabel' if dry_run else 'relabelled'} to label "
        f"rule {LABEL_VERSION!r} ({report.changed} onset(s) moved), {len(report.current)} "
        f"already current, {len(report.skipped)} unlabelled or raw guarded left as they are",
        soft_wrap=True,
    )
