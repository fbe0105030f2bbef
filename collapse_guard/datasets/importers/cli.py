"""``collapse-guard data import`` and ``collapse-guard data summary``.

Plain functions with typer annotations (mounted by ``collapse_guard.datasets.cli``);
pandas, pyarrow, rich progress and matplotlib are imported inside the bodies so that
``collapse-guard --help`` stays fast.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Annotated

import typer

from collapse_guard.errors import print_error

__all__ = ["import_logs_command", "summary_command"]

# A tree with one broken column would otherwise fill the screen.
_MAX_WARNINGS_SHOWN = 20


def import_logs_command(
    paths: Annotated[
        list[Path], typer.Argument(help="Log files or folders (searched recursively).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the run files.")],
    force: Annotated[
        bool, typer.Option("--force", help="Rewrite run files that already exist.")
    ] = False,
) -> None:
    """Import training logs (CSV/JSONL, Megatron, AlgoPerf, modded-nanogpt/llm.c) as runs."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from collapse_guard.datasets.importers.core import find_files, import_files

    console = Console()
    try:
        n_files = len(find_files(paths))
    except FileNotFoundError as err:
        print_error(err)
        raise typer.Exit(2) from None
    start = time.perf_counter()
    columns = (TextColumn("importing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with warnings.catch_warnings(record=True) as caught, Progress(*columns, console=console) as bar:
        warnings.simplefilter("always")
        task = bar.add_task("import", total=n_files)
        report = import_files(paths, out, force=force, on_file=lambda _: bar.advance(task))
    seconds = time.perf_counter() - start

    for w in caught[:_MAX_WARNINGS_SHOWN]:
        console.print(f"[yellow]warning:[/yellow] {w.message}", highlight=False)
    if len(caught) > _MAX_WARNINGS_SHOWN:
        console.print(f"[yellow]... and {len(caught) - _MAX_WARNINGS_SHOWN} more warnings")
    formats = ", ".join(
        f"{fmt}: {report.runs_by_format[fmt]} runs from {n} files"
        for fmt, n in sorted(report.files_by_format.items())
    )
    console.print(f"{n_files} files in {seconds:.1f} s; {formats or 'no known log format found'}")
    if report.unknown:
        names = ", ".join(f"{name} x{n}" for name, n in report.unknown.most_common(4))
        console.print(
            f"skipped {sum(report.unknown.values())} files of no known format ({names}, ...)"
        )
    for fmt, n in sorted(report.no_curve.items()):
        console.print(f"skipped {n} {fmt} files without a training-loss curve")
    if report.too_short:
        console.print(f"skipped {report.too_short} runs with fewer than 2 logged steps")
    if not report.runs:
        raise _nothing_imported(paths, n_files)
    collapses = ", ".join(f"{kind}: {n}" for kind, n in report.collapses.most_common())
    console.print(
        f"{len(report.runs)} runs in {out} ({report.written} written, {report.existing} already "
        f"there); collapses: {sum(report.collapses.values())} ({collapses or 'none'}); "
        f"spikes: {report.spikes} in {report.runs_with_spikes} runs"
    )


def _nothing_imported(paths: list[Path], n_files: int) -> Exception:
    """The error for an import that found no run: what was given, and what is recognised
    (each format's own description, so the list cannot fall behind the importers)."""
    from collapse_guard.datasets.importers.core import FORMATS
    from collapse_guard.errors import UserInputError

    recognised = "; ".join(
        f"{fmt.NAME}: " + fmt.sniff.__doc__.strip().split("\n")[0].replace("``", "").rstrip(".")
        for fmt in FORMATS
    )
    given = ", ".join(map(str, paths))
    found = f"{n_files} files, no training-loss curve of 2 or more steps" if n_files else "no files"
    return UserInputError(
        f"nothing to import from {given}: {found}",
        f"expected training logs; recognised: {recognised}",
    )


def summary_command(
    folder: Annotated[Path, typer.Argument(help="Folder of run files (searched recursively).")],
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="PNG to write; default FOLDER/summary.png."),
    ] = None,
) -> None:
    """Print a dataset card (runs by source and outcome, onsets, spikes, coverage) and a plot."""
    from rich.console import Console

    from collapse_guard.runfiles.card import plot_card, print_card, summarize
    from collapse_guard.runfiles.format import RunFileError

    console = Console()
    try:
        card = summarize(folder)
    except (FileNotFoundError, RunFileError) as err:
        print_error(err)
        raise typer.Exit(2) from None
    if card.n_runs == 0:
        print_error(
            f"{folder}: expected run files (*.parquet), found none; "
            "create some with `collapse-guard data real|synth|import`"
        )
        raise typer.Exit(2)
    print_card(card, console)
    written = plot_card(card, plot or Path(folder) / "summary.png")
    console.print(f"plot: {written}")
