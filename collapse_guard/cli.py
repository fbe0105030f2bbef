"""The ``collapse-guard`` command.

Each part owns its sub-commands in its own ``cli`` module; this file only mounts them,
so that the parts stay independent and ``collapse-guard --help`` stays fast: no command
module imports torch, mlflow, lightgbm or bentoml before its command runs
(``tests/test_command_line.py``).

Output. Off a terminal (a pipe, a CI log) rich's output is :data:`PIPE_COLUMNS` wide
unless ``COLUMNS`` says otherwise, and MLflow draws no download progress bars
(:func:`command_environment`).

Errors. Every command's bad input (a damaged or foreign file, a missing model, too few
runs; ``collapse_guard.errors.is_user_error``) ends here as one line on stderr and exit
code 2, whichever command raised it; ``--debug`` shows the traceback instead. Any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

from collapse_guard.datasets.cli import app as data_app
from collapse_guard.demo import demo
from collapse_guard.errors import is_user_error, print_error
from collapse_guard.predictor.cli.calibrate import calibrate_command
from collapse_guard.predictor.cli.commands import evaluate_command, predict_command, train_command
from collapse_guard.predictor.cli.retrain import retrain as retrain_command
from collapse_guard.service.server.serve_command import serve_command

__all__ = [
    "PIPE_COLUMNS",
    "ErrorHandlingGroup",
    "app",
    "command_environment",
    "spread_repeated_options",
]

_DEBUG = "debug"  # the global option's parameter name


def spread_repeated_options(command, args: list[str]) -> list[str]:
    """``--runs a b`` as ``--runs a --runs b``: an option that may be given many times takes
    every value up to the next option (shell globs: ``--runs data/*/``).

    Only for commands without positional arguments, which the values could swallow.
    """
    params = command.params
    if any(isinstance(p, TyperArgument) for p in params):
        return args
    repeated = {
        name
        for p in params
        if isinstance(p, TyperOption) and p.multiple and not p.is_flag
        for name in p.opts
    }
    out: list[str] = []
    option, n_values = None, 0  # the repeated option being read, and its values so far
    for i, arg in enumerate(args):
        if arg == "--":
            return [*out, *args[i:]]
        if arg.startswith("-"):
            name, has_value, _ = arg.partition("=")
            option, n_values = (name, int(bool(has_value))) if name in repeated else (None, 0)
        elif option is not None:
            if n_values:
                out.append(option)
            n_values += 1
        out.append(arg)
    return out


# Columns of rich's output when stdout is no terminal (a pipe, a CI log, `| tee`): rich's
# own default there is 80, which wraps table rows, titles and notes mid-line.
PIPE_COLUMNS = 200


@contextmanager
def command_environment() -> Iterator[None]:
    """The environment every command runs in, as the user's own settings leave it:
    wide output off a terminal (``COLUMNS``, unless set) and no MLflow download progress
    bars (they filled ``evaluate`` and ``serve``). Restored afterwards: the command may
    run inside another program (tests, a notebook)."""
    wanted = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    if not sys.stdout.isatty():
        wanted["COLUMNS"] = str(PIPE_COLUMNS)
    added = [name for name in wanted if name not in os.environ]
    os.environ.update({name: wanted[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


class ErrorHandlingGroup(TyperGroup):
    """The top-level group: a user error from any command, however deep, is caught here;
    and an option that may be repeated takes many values (:func:`spread_repeated_options`).
    """

    def resolve_command(self, ctx: typer.Context, args: list[str]):
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and not isinstance(command, TyperGroup):
            rest = spread_repeated_options(command, rest)
        return name, command, rest

    def invoke(self, ctx: typer.Context):
        try:
            with command_environment():
                return super().invoke(ctx)
        except Exception as error:
            if ctx.params.get(_DEBUG) or not is_user_error(error):
                raise
            print_error(error)
            raise typer.Exit(2) from None


app = typer.Typer(
    cls=ErrorHandlingGroup,
    help="Forecast and prevent training collapse.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _options(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar="COLLAPSE_GUARD_DEBUG",
            help="Show the full traceback of an input error instead of one line.",
        ),
    ] = False,
) -> None:
    """Forecast and prevent training collapse."""
    # --debug is read from the context by ErrorHandlingGroup.invoke


app.add_typer(data_app, name="data", help="Make, import and summarise run files.")
app.command(name="train", help="Train a risk model on run files and track it in MLflow.")(
    train_command
)
app.command(
    name="retrain",
    help="Retrain on new runs; the challenger becomes champion only by the promotion rule.",
)(retrain_command)
app.command(name="calibrate", help="Set a model's alarm levels on your own healthy runs.")(
    calibrate_command
)
app.command(name="evaluate", help="Evaluate a risk model beside the baselines.")(evaluate_command)
app.command(name="predict", help="Score one run and plot its risk.")(predict_command)
app.command(
    name="demo", help="Train a small model with the probe; the bundled model scores it live."
)(demo)
app.command(name="serve", help="Serve collapse risk over HTTP (BentoML).")(serve_command)


if __name__ == "__main__":
    app()
