"""A killed server takes its workers with it (issue 31, case 10).

circus starts each worker in a session of its own, so SIGKILL to ``bentoml serve`` or to
its process group used to leave both workers running (parent pid 1) and answering on the
socket they inherited. Real servers, 2 workers each.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from server_processes import alive, answers, started

LIMIT_SECONDS = 10.0  # the death signal is at once; the watchdog's last resort is ~5.5 s


def _gone_within(server, limit: float) -> tuple[set[int], bool]:
    """(workers still alive, port still answering) once both end or ``limit`` passes."""
    deadline = time.monotonic() + limit
    while True:
        left = {p for p in server.workers if alive(p)}
        still = answers(server.url)
        if (not left and not still) or time.monotonic() > deadline:
            return left, still
        time.sleep(0.2)


@pytest.mark.slow  # a real 2-worker server each: ~30 s on this 2-core machine
def test_sigkill_to_the_server_alone_stops_its_workers(tmp_path):
    with started(tmp_path, plain=False) as server:
        assert answers(server.url)
        os.kill(server.proc.pid, signal.SIGKILL)  # the leader only, not its group
        left, still = _gone_within(server, LIMIT_SECONDS)
        assert left == set(), f"workers {sorted(left)} outlived their server"
        assert not still, "the port still answers with the server dead"


@pytest.mark.slow  # a real 2-worker server each: ~30 s on this 2-core machine
def test_sigkill_to_the_process_group_stops_its_workers(tmp_path):
    with started(tmp_path, plain=True) as server:
        os.killpg(server.proc.pid, signal.SIGKILL)
        left, still = _gone_within(server, LIMIT_SECONDS)
        assert left == set(), f"workers {sorted(left)} outlived their server"
        assert not still, "the port still answers with the server dead"
