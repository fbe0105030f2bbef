"""A worker keeps the memory a request freed for the next one (glibc's allocator)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# a request's few arrays of megabytes, made and freed 50 times; prints the page faults
_REQUESTS = """
import resource, sys
import numpy as np
from collapse_guard.service.middleware.memory import keep_freed_memory
tuned = keep_freed_memory() if sys.argv[1] == "tuned" else None
def request():
    arrays = [np.ones(400_000) for _ in range(4)]  # 3.2 MB each
    del arrays
request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    request()
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, **malloc_env: str) -> tuple[str, int]:
    # without the MALLOC_* variables of this process (dask's nanny sets one in os.environ)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | malloc_env
    out = subprocess.run(
        [sys.executable, "-c", _REQUESTS, mode], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_request_memory_is_reused_not_faulted_in_again():
    _, plain = _faults("plain")
    tuned, faults = _faults("tuned")
    assert tuned == "True"
    # 50 requests x 4 arrays x ~780 pages each, faulted in again without the tuning
    assert plain > 50_000 and faults < 500


def test_the_users_malloc_environment_is_left_alone():
    tuned, _ = _faults("tuned", MALLOC_TRIM_THRESHOLD_="1000000")
    assert tuned == "False"
