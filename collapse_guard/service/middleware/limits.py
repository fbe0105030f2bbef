"""The service's limits, each with the evidence it rests on.

Every limit can be lowered or raised per deployment through the environment variable
named beside it; the defaults are sized for the default window (200 steps) of every
signal, measured on the project's 2-core development machine (docs/stack.md, "BentoML 1.4").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from collapse_guard.service.client.wire import MAX_TOP_K

__all__ = ["Limits"]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"{name} must be a whole number; got {raw!r}; unset it for the default {default}"
        ) from None
    if value < 1:
        raise ValueError(f"{name} must be >= 1; got {value}; unset it for the default {default}")
    return value


@dataclass(frozen=True)
class Limits:
    """What one request may hold. Build with :meth:`from_env`."""

    # Steps per run. A model reads only its last `window` (200) steps, and run context
    # travels separately, so longer windows are waste; 4,096 leaves 20x headroom for
    # callers that send "everything since the last call" (the issue's own figure).
    max_steps: int = 4096  # COLLAPSE_GUARD_MAX_STEPS
    # Runs per request. A JSON batch of 64 windows (200 steps x 23 signals, full-precision
    # floats) is 6.1 MB and parses in 45 ms here (pydantic, measured 2026-11-30); 256 runs
    # is ~25 MB and ~0.2 s of one worker: the most a single request should hold a worker.
    max_runs: int = 256  # COLLAPSE_GUARD_MAX_RUNS
    # Body bytes, JSON or Arrow. BentoML has no limit of its own: a 123 MB body was parsed
    # in 14 s with 1.2 GB of worker memory (docs/stack.md, "BentoML 1.4"), ~10 bytes of
    # memory per body byte.
    # 32 MiB holds the largest default batch (256 x 200 steps, ~25 MB) and caps a request
    # at ~0.3 GB of worker memory.
    max_body_bytes: int = 32 * 1024 * 1024  # COLLAPSE_GUARD_MAX_BODY_BYTES
    # Top contributing features per run in /risk answers; /explain gives them all. The
    # wire's own bound (RiskRequest.top_k's schema), so not set per deployment.
    max_top_k: int = MAX_TOP_K
    # Seconds a request body may stall (no byte arriving) before a 408 frees its
    # connection: a Content-Length of 40 MB with 2 bytes sent waited for the 60 s
    # traffic timeout. A client writing a whole body stalls for milliseconds.
    body_idle_seconds: int = 5  # COLLAPSE_GUARD_BODY_IDLE_SECONDS

    @classmethod
    def from_env(cls) -> Limits:
        """Defaults, overridden by COLLAPSE_GUARD_MAX_STEPS / _MAX_RUNS / _MAX_BODY_BYTES /
        _BODY_IDLE_SECONDS."""
        return cls(
            max_steps=_env_int("COLLAPSE_GUARD_MAX_STEPS", cls.max_steps),
            max_runs=_env_int("COLLAPSE_GUARD_MAX_RUNS", cls.max_runs),
            max_body_bytes=_env_int("COLLAPSE_GUARD_MAX_BODY_BYTES", cls.max_body_bytes),
            body_idle_seconds=_env_int("COLLAPSE_GUARD_BODY_IDLE_SECONDS", cls.body_idle_seconds),
        )
