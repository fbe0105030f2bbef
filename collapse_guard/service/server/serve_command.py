"""``collapse-guard serve``: start the risk service (BentoML) on this machine.

Checks its options and loads the model once here, so that a typo or a missing model is
one line and exit code 2 rather than a worker's traceback, then hands over to
``bentoml serve collapse_guard.service.server.risk_service:RiskService`` (the same
process: exec) with the settings in the environment, exactly as a user starting BentoML
by hand would.
Heavy imports (bentoml, lightgbm) happen inside the command, never at ``--help``.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from typing import Annotated

import typer

from collapse_guard.errors import UserInputError

__all__ = ["SERVICE", "serve_command", "serve_environment"]

SERVICE = "collapse_guard.service.server.risk_service:RiskService"


def _fail(message: str) -> None:
    raise UserInputError(message)  # one line and exit code 2 (collapse_guard.cli)


def _number(text: str, name: str, kind: type, low: float, high: float | None = None) -> float:
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        upper = f"..{high}" if high is not None else " or more"
        _fail(
            f"{name} must be a {'whole ' if kind is int else ''}number {low}{upper}; got {text!r}"
        )
    return value


def _check_port(host: str, port: int) -> None:
    """A one-line error now rather than the process manager's 56-line traceback later."""
    try:
        with socket.create_server((host, port)):  # SO_REUSEADDR, as uvicorn binds
            pass
    except OSError as error:
        taken = error.errno == errno.EADDRINUSE
        _fail(
            f"cannot listen on {host}:{port}: "
            + ("the port is in use (another server?)" if taken else error.strerror or str(error))
            + "; choose another with --port, or stop what holds it"
        )


def serve_environment(model: str | None, workers: int, poll: float) -> dict[str, str]:
    """The environment the service's workers read (risk_service.py's table)."""
    # the workers' reload channel: a name no other process can guess (reload_channel.py),
    # made only by a first reload: no folder left behind in the temp directory per serve
    from collapse_guard.service.server.reload_channel import fresh_channel_path

    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "passive")  # before lightgbm (docs/stack.md, "OpenMP")
    env.update(
        COLLAPSE_GUARD_MODEL=model or "default",
        COLLAPSE_GUARD_WORKERS=str(workers),
        COLLAPSE_GUARD_POLL=str(poll),
        COLLAPSE_GUARD_RELOAD_FILE=str(fresh_channel_path()),  # fresh: no stale reloads
    )
    return env


def serve_command(
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="'default' (bundled), a model folder, 'champion' / '@ALIAS' or a models:/ URI.",
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[str, typer.Option("--port", metavar="PORT", help="TCP port.")] = "3000",
    workers: Annotated[
        str, typer.Option("--workers", metavar="N", help="Worker processes (one per core).")
    ] = "1",
    poll: Annotated[
        str,
        typer.Option(
            "--poll", metavar="SECONDS", help="Reload when the models:/ alias moves (0: off)."
        ),
    ] = "0",
) -> None:
    """Serve collapse risk over HTTP: POST /risk, /explain, /reload; GET /model, /metrics."""
    port_n = int(_number(port, "--port", int, 1, 65535))
    workers_n = int(_number(workers, "--workers", int, 1, 64))
    poll_s = float(_number(poll, "--poll", float, 0))
    _check_port(host, port_n)
    from collapse_guard.predictor.core.model_source import resolve_model_source
    from collapse_guard.predictor.core.store import is_registry_uri

    given, model = model, resolve_model_source(model)  # 'champion' -> models:/...@champion
    if model is not None and not is_registry_uri(model) and not os.path.exists(model):
        _fail(
            f"--model {given}: {model} does not exist; expected a model folder (written by "
            "`collapse-guard calibrate --out` or RiskModel.save), 'default', 'champion', "
            "'@ALIAS' or a models:/ URI"
        )
    if poll_s and not (model or "").startswith("models:/"):
        _fail(f"--poll needs a models:/NAME@ALIAS model to watch; got --model {given!r}")
    from collapse_guard.service.server.model_state import ModelLoadError, load_serving

    try:
        serving = load_serving(model)
    except ModelLoadError as error:  # bad input, not a bug: the message says what and why
        raise UserInputError(str(error)) from None  # one line and exit code 2
    typer.echo(
        f"serving {serving.scorer.name} {serving.version} ({serving.source}) on "
        f"http://{host}:{port_n} with {workers_n} worker(s)",
        err=True,
    )
    argv = [
        sys.executable,
        "-m",
        "bentoml",
        "serve",
        SERVICE,
        "--host",
        host,
        "--port",
        str(port_n),
    ]
    sys.stdout.flush()
    os.execve(sys.executable, argv, serve_environment(model, workers_n, poll_s))
