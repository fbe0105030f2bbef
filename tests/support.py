"""Helpers shared by several test folders, importable as ``support`` from any of them.

Test folders are not packages, so each folder's ``conftest.py`` is imported under the one
name ``conftest``: a test importing from ``conftest`` gets whichever folder's came first.
Shared code lives here (``tests/`` is on ``sys.path`` through the root conftest), and each
folder's own constants in a module of a name found nowhere else.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx

__all__ = ["free_port", "serve_process", "wait_ready"]


def free_port() -> int:
    """A loopback TCP port free at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, log: Path, limit: float = 180.0) -> None:
    """Return once ``url``'s ``/readyz`` answers 200; raise with the server's log tail if
    it exits or is not ready within ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the server was not ready in {limit} s:\n{log.read_text()[-3000:]}")


@contextmanager
def serve_process(
    folder: Path, args: list[str], env: Mapping[str, str]
) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    """``collapse-guard serve ARGS`` on a free loopback port, in its own process group.

    Yields ``(url, process, log)`` as soon as it is started (callers may prepare other
    things while it loads, then :func:`wait_ready`); SIGTERM to the group at the end
    (``bentoml serve`` forks its workers), SIGKILL if it does not stop in 20 s.
    """
    port = free_port()
    command = Path(sys.executable).with_name("collapse-guard")
    log = folder / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(command), "serve", "--port", str(port), *args],
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield f"http://127.0.0.1:{port}", proc, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
