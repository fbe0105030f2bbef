"""``collapse-guard data ...``: each source owns its command in its own module; this mounts them."""

from __future__ import annotations

import typer

from collapse_guard.datasets.importers.cli import import_logs_command, summary_command
from collapse_guard.datasets.real.cli import real_command
from collapse_guard.datasets.relabel_cli import relabel_command
from collapse_guard.datasets.synthetic.cli import synth_command

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True)
app.command("real", help="Train small transformers here and record labelled runs.")(real_command)
app.command("synth", help="Generate synthetic labelled runs.")(synth_command)
app.command("import", help="Import training logs (CSV, JSONL, Megatron, AlgoPerf, ...).")(
    import_logs_command
)
app.command("summary", help="Print a dataset card and write a plot.")(summary_command)
app.command("relabel", help="Relabel runs labelled under an older label rule.")(relabel_command)
