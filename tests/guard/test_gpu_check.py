"""benchmarks/gpu_check.py on the CPU, as CI runs it: every check runs or says why not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_the_gpu_check_runs_on_the_cpu_and_names_what_it_skips():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--cpu"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    status = {}
    for line in lines:
        status.setdefault(line.split("]")[1].split(":")[0].strip(), []).append(line[1:5])
    assert status == {
        "overhead": ["PASS", "PASS"],  # bf16 autocast; fp16 with a GradScaler
        "syncs": ["PASS", "PASS"],
        "nvml": ["SKIP"],
        "sdpa": ["SKIP", "PASS"],  # flash / mem-efficient skipped; the CPU kernel runs
    }
    # the deferred guard makes no host read on a healthy step; the fp16 path reads at once
    syncs = [line for line in lines if "syncs" in line]
    assert "0.0 .item()-like calls" in syncs[0] and "deferred facts" in syncs[0]
    assert "read at once" in syncs[1]
    assert "no CUDA device" in done.stdout and "all run checks passed" in done.stdout
