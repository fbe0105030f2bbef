"""The ``collapse-guard`` command.

Each part owns its sub-commands in its own ``cli`` module; this file only mounts them,
so that the parts stay independent and ``collapse-guard --help`` stays fast: no command
module imports torch, mlflow, lightgbm or bentoml before its command runs
(``tests/test_command_line.py``).
"""

from __future__ import annotations

import typer

from collapse_guard.datasets.cli import app as data_app
from collapse_guard.demo import demo
from collapse_guard.predictor.cli import evaluate_command, predict_command, train_command
from collapse_guard.service.cli import serve_command

__all__ = ["app"]

app = typer.Typer(
    help="Forecast and prevent training collapse.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(data_app, name="data", help="Make, import and summarise run files.")
app.command(name="train", help="Train a risk model on run files and track it in MLflow.")(
    train_command
)
app.command(name="evaluate", help="Evaluate a risk model beside the baselines.")(evaluate_command)
app.command(name="predict", help="Score one run and plot its risk.")(predict_command)
app.command(
    name="demo", help="Train a small model with the probe; the bundled model scores it live."
)(demo)
app.command(name="serve", help="Serve collapse risk over HTTP (BentoML).")(serve_command)


if __name__ == "__main__":
    app()
