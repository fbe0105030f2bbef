"""Real servers for the process tests: start one, know its workers, leave none behind.

A server's workers are in sessions of their own (circus ``setsid``s them), so a test that
kills the server must end any worker it left by pid: :func:`started` records them once the
server is ready and SIGKILLs whichever is still alive at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
from helpers import TOKEN, worker_pids
from support import free_port, wait_ready

__all__ = ["Server", "alive", "answers", "started"]

SERVICE = "collapse_guard.service.server.risk_service:RiskService"


class Server:
    def __init__(self, url: str, proc: subprocess.Popen, workers: set[int]) -> None:
        self.url, self.proc, self.workers = url, proc, workers


def alive(pid: int) -> bool:
    """A running process (a zombie is dead, only not yet reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/livez", timeout=1.0)
        return True
    except httpx.TransportError:
        return False


def _env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLAPSE_GUARD_RELOAD_FILE")}
    env.update(
        BENTOML_HOME=str(folder / "bentoml"),
        BENTOML_DO_NOT_TRACK="true",
        OMP_WAIT_POLICY="passive",
        COLLAPSE_GUARD_TOKEN=TOKEN,
    )
    return env


@contextmanager
def started(folder: Path, *, plain: bool) -> Iterator[Server]:
    """A 2-worker server of the default model, token TOKEN, in its own process group:
    ``bentoml serve`` by hand (``plain``) or ``collapse-guard serve``."""
    port = free_port()
    env = _env(folder)
    if plain:
        env.update(COLLAPSE_GUARD_WORKERS="2", COLLAPSE_GUARD_MODEL="default")
        command = [sys.executable, "-m", "bentoml", "serve", SERVICE, "--port", str(port)]
    else:
        serve = str(Path(sys.executable).with_name("collapse-guard"))
        command = [serve, "serve", "--port", str(port), "--workers", "2", "--model", "default"]
    log = folder / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            env=env,
            cwd=folder,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    workers: set[int] = set()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, log)
        deadline = time.monotonic() + 30
        while len(workers) < 2 and time.monotonic() < deadline:
            workers = worker_pids(proc)
            time.sleep(0.2)
        assert len(workers) == 2, workers
        yield Server(url, proc, workers)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in workers:  # a worker the test's kill left behind: ours to end
            if alive(pid) and "_bentoml_impl.worker" in " ".join(psutil.Process(pid).cmdline()):
                os.kill(pid, signal.SIGKILL)
