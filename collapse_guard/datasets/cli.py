"""``collapse-guard data ...``: each source owns its command in its own module; this mounts them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from collapse_guard.datasets.importers.cli import import_logs_command, summary_command
from collapse_guard.datasets.real.cli import real_command
from collapse_guard.datasets.real.config import ARCHITECTURE_CHOICES
from collapse_guard.datasets.relabel_cli import relabel_command
from collapse_guard.datasets.synthetic.cli import synth_command

__all__ = ["CARD_KEYS", "app", "card_command", "compact_command"]

# what a pack card counts runs by: the model family, each architecture component the
# ``drawn`` family draws on its own (hand-written families record theirs too), the head
# count, and the optimizer, recipe, data and precision of the sampler
CARD_KEYS: tuple[str, ...] = (
    "family",
    *ARCHITECTURE_CHOICES,
    "attention",  # the breadth sweep's draws (full, grouped- or multi-query; qk-norm)
    "qk_norm",
    "n_head",
    "optimizer",
    "recipe",
    "data",
    "precision",
)


def card_command(
    folder: Annotated[Path, typer.Argument(help="Folder of run files (searched recursively).")],
    write: Annotated[
        Path | None,
        typer.Option("--write", help="README whose card block to replace; default: print."),
    ] = None,
) -> None:
    """Count the runs by outcome and by family, component, optimizer, recipe and data, as
    Markdown: printed, or written between the card lines of a README (corpus/README.md)."""
    from collapse_guard.errors import UserInputError, print_error
    from collapse_guard.runfiles.card import card_markdown, pack_card, replace_card

    try:
        card = pack_card(folder, CARD_KEYS)
        if card.n_runs == 0:
            raise UserInputError(
                f"{folder}: expected run files (*.parquet), found none",
                "make some with `collapse-guard data real`",
            )
        text = card_markdown(card)
        if write is None:
            typer.echo(text, nl=False)
            return
        replace_card(write, text)
    except (FileNotFoundError, UserInputError) as err:
        print_error(err)
        raise typer.Exit(2) from None
    typer.echo(f"{write}: card of {card.n_runs} runs in {folder} written")


def compact_command(
    folder: Annotated[Path, typer.Argument(help="Folder of run files (searched recursively).")],
) -> None:
    """Rewrite the float64 run files under FOLDER compact (float32 signals but the LR, as
    `data real` writes them now): the same numbers for probe-recorded runs, a third smaller.
    Each file is replaced atomically; files already compact are left alone."""
    from collapse_guard.errors import UserInputError, print_error
    from collapse_guard.runfiles.reader import list_runs
    from collapse_guard.runfiles.writer import compact_file

    try:
        paths = list_runs(folder)
        before = sum(path.stat().st_size for path in paths)
        rewritten = sum(compact_file(path) for path in paths)
    except (FileNotFoundError, UserInputError) as err:
        print_error(err)
        raise typer.Exit(2) from None
    after = sum(path.stat().st_size for path in paths)
    typer.echo(
        f"{folder}: {rewritten} of {len(paths)} run files rewritten compact; "
        f"{before / 1e6:.2f} MB -> {after / 1e6:.2f} MB"
    )


app = typer.Typer(no_args_is_help=True)
app.command("real", help="Train small transformers here and record labelled runs.")(real_command)
app.command("synth", help="Generate synthetic labelled runs.")(synth_command)
app.command("import", help="Import training logs (CSV, JSONL, Megatron, AlgoPerf, ...).")(
    import_logs_command
)
app.command("summary", help="Print a dataset card and write a plot.")(summary_command)
app.command("card", help="Count runs by outcome, family, component, optimizer, recipe.")(
    card_command
)
app.command("compact", help="Rewrite float64 run files compact (float32 signals).")(compact_command)
app.command(
    "relabel",
    help="Relabel runs labelled under an older label rule, and label runs recorded without one.",
)(relabel_command)
