"""Seeded run windows and request bodies for the service tests."""

from __future__ import annotations

import re
import time

import httpx
import numpy as np
import pandas as pd

TOKEN = "test-token-7f3a"  # the served instance's COLLAPSE_GUARD_TOKEN
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def worker_pids(server) -> set[int]:
    """The pids of a served instance's workers (a restarted worker has a new one)."""
    import psutil

    pids = set()
    for child in psutil.Process(server.pid).children(recursive=True):
        try:  # a crashed worker is a zombie until reaped: not a live worker
            if child.status() != psutil.STATUS_ZOMBIE and "_bentoml_impl.worker" in " ".join(
                child.cmdline()
            ):
                pids.add(child.pid)
        except psutil.Error:
            continue
    return pids


def window(seed: int, signals, steps: int = 200, start: int = 0, holes: float = 0.05):
    """A run frame: ``step`` + a random walk per signal, some values NaN (not measured),
    a few measured non-finite ones, the attention family every 50 steps only."""
    rng = np.random.default_rng(seed)
    frame = {"step": np.arange(start, start + steps, dtype=np.int64)}
    for k, name in enumerate(signals):
        walk = 1.0 + 0.05 * np.cumsum(rng.normal(size=steps)) + 0.1 * k
        walk[rng.random(steps) < holes] = np.nan
        if name.startswith("attn_"):
            walk[(frame["step"] % 50) != 0] = np.nan
        frame[name] = walk
    if "loss" in frame:
        frame["loss"] = 2.6 + np.abs(frame["loss"] - 1.0)
        if seed % 3 == 0:
            frame["loss"][-3] = np.inf  # a measured non-finite value is data
    # the companion flags as the probe writes them: 1 where the value was measured
    # non-finite, else 0 (a random walk there would mark NaN holes as measured NaN)
    for name, flag in (("loss", "loss_nonfinite"), ("grad_norm", "grad_nonfinite")):
        if flag in frame and name in frame:
            frame[flag] = np.isinf(frame[name]).astype(np.float64)
    return pd.DataFrame(frame)


def run_json(frame: pd.DataFrame, run_id: str, context=None) -> dict:
    """The wire form of a frame; NaN as null, +-inf as the strings "Infinity"/"-Infinity"."""

    def cell(x: float):
        if np.isnan(x):
            return None
        if np.isinf(x):
            return "Infinity" if x > 0 else "-Infinity"
        return float(x)

    signals = {c: [cell(x) for x in frame[c]] for c in frame.columns if c != "step"}
    run = {"run_id": run_id, "steps": frame["step"].tolist(), "signals": signals}
    if context is not None:
        run["context"] = context
    return run


def context_of(frame: pd.DataFrame, model) -> dict:
    """The run context at the frame's last row, fed step by step (as a guard would)."""
    from collapse_guard.features.context import RunContext

    ctx = RunContext.from_schema(model.schema)
    names = [c for c in frame.columns if c != "step"]
    for row in frame.itertuples(index=False):
        record = row._asdict()
        ctx.update(int(record.pop("step")), {n: float(record[n]) for n in names})
    return ctx.get()


def serving_by_worker(url: str) -> dict[str, str]:
    """worker index -> model version, from collapse_guard_model_info (one series each)."""
    text = httpx.get(url + "/metrics", headers=AUTH).text
    out = {}
    for line in text.splitlines():
        if line.startswith("collapse_guard_model_info{") and line.endswith(" 1.0"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            out[labels["worker"]] = labels["model_version"]
    return out


def until_every_worker_serves(url: str, version: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while True:
        serving = serving_by_worker(url)
        if len(serving) == 2 and set(serving.values()) == {version}:
            return
        assert time.monotonic() < deadline, f"workers serve {serving}, not all {version}"
        time.sleep(0.2)
