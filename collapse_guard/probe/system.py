"""System group: the machine's memory and the GPU's power, as the seed monitors them.

========================  ========================================================
key                       meaning
========================  ========================================================
``host_mem_available``    MemAvailable from /proc/meminfo, bytes (NaN elsewhere)
``gpu_power_w``           power draw of the model's GPU, watts (NaN without CUDA
                          or NVML)
``gpu_mem_used``          memory used on that GPU, bytes, all processes (NaN
                          without CUDA or NVML)
========================  ========================================================

Host reads, no device sync. ``torch.cuda.power_draw`` and ``device_memory_used`` go
through NVML (``pynvml``) and map CUDA_VISIBLE_DEVICES for us.
"""

from __future__ import annotations

import math

import torch

from collapse_guard.probe.state import ProbeState, SignalGroup

__all__ = ["SystemGroup", "host_mem_available"]


def host_mem_available(path: str = "/proc/meminfo") -> float:
    """MemAvailable in bytes, or NaN where /proc/meminfo is missing or lacks it."""
    try:
        with open(path) as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0  # the file says kB
    except OSError:
        pass
    return math.nan


class SystemGroup(SignalGroup):
    keys = ("host_mem_available", "gpu_power_w", "gpu_mem_used")
    period_field = "system_every"

    def reset(self) -> None:
        super().reset()
        self._nvml_ok = True  # flips to False at the first NVML failure: no retry per step

    def update(self, state: ProbeState) -> SystemGroup:
        values: dict[str, float] = {"host_mem_available": host_mem_available()}
        device = next((p.device for p in state.model.parameters()), torch.device("cpu"))
        if device.type == "cuda" and self._nvml_ok:
            try:
                values["gpu_power_w"] = torch.cuda.power_draw(device) / 1000.0  # mW -> W
                values["gpu_mem_used"] = float(torch.cuda.device_memory_used(device))
            except Exception:  # no pynvml, no permission, a MIG slice...: NaN from now on
                self._nvml_ok = False
        self._values = values
        return self
