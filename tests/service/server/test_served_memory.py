"""A worker's memory stays flat under many requests (issue 31, case 5).

BentoML's timeout middleware kept every request's timer, and with it ~5 KB, for its
whole 60 s timeout (service/middleware/timeout.py): 415 to 780 MB over 105,000 requests.
"""

from __future__ import annotations

import os

import httpx
import psutil
import pytest
from helpers import AUTH, run_json, window, worker_pids

REQUESTS = int(os.environ.get("COLLAPSE_GUARD_MEMORY_REQUESTS", "100000"))
WARM = REQUESTS // 10


def _rss_mb(pids: set[int]) -> dict[int, float]:
    return {pid: psutil.Process(pid).memory_info().rss / 2**20 for pid in pids}


@pytest.mark.slow
def test_100k_requests_leave_each_worker_within_50_mb_of_its_size_at_10k(
    served, served_server, default_model
):
    body = {"runs": [run_json(window(3, default_model.schema.signals, steps=64), "m")]}
    # what a busy fleet sends: health probes, model reads, a scored window, made-up paths
    mix = [
        ("GET", "/livez", {}, None),
        ("GET", "/readyz", {}, None),
        ("GET", "/model", AUTH, None),
        ("GET", "/no-such-path", {}, None),
        ("POST", "/risk", AUTH, body),
    ]
    pids = worker_pids(served_server[1])
    statuses: dict[int, int] = {}
    sizes = {}
    with httpx.Client(base_url=served, timeout=30) as http:
        for i in range(REQUESTS):
            method, path, headers, payload = mix[i % len(mix)]
            status = http.request(method, path, headers=headers, json=payload).status_code
            statuses[status] = statuses.get(status, 0) + 1
            if i + 1 == WARM:
                sizes["warm"] = _rss_mb(pids)
    sizes["end"] = _rss_mb(pids)
    assert worker_pids(served_server[1]) == pids  # no worker restarted
    assert set(statuses) <= {200, 401, 404} and statuses.get(200, 0) > REQUESTS // 2, statuses
    growth = {pid: sizes["end"][pid] - sizes["warm"][pid] for pid in pids}
    assert all(mb < 50 for mb in growth.values()), (sizes, growth)
