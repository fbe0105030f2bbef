"""Latency and throughput of the risk service, beside the embedded model, in one run.

    OMP_WAIT_POLICY=passive .venv/bin/python benchmarks/service_latency.py

Starts ``collapse-guard serve`` itself (loopback, a free port, the bundled model) at 1 and
then 2 workers, and measures:

- latency: one window of 200 steps x every model signal (23) through ``RiskClient``
  (keep-alive connection, top 5 factors, Arrow as the client sends by default), one
  request at a time: p50, p99. Target (issue 9): p99 <= 10 ms. Beside it, to say where
  the time goes: the client sending JSON, the client on httpx's default transport
  (httpcore) instead of its own, the Arrow body posted ready-made through httpcore (no
  client-side work) and ``GET /livez`` (the HTTP floor);
- throughput at 2 workers: batches of 64 such windows, JSON and Arrow, from 4 concurrent
  senders on RiskClient's transport, bodies encoded once beforehand (what is timed is
  the service, not the client's encoder): windows per second, with the top 5
  contributing features per window (the default; SHAP costs about as much as the
  features) and without (``top_k=0``). Targets: >= 2,000 (JSON), >= 8,000 (Arrow);
- the embedded path in this process: ``RiskModel.predict_window(frame, context={})`` per
  window, and ``predict_windows`` of 64 frames per window, and the service's overhead as
  the ratio of its p50 to the embedded window;
- CPU per request of the serving processes (1 worker), from the kernel's counters: what
  the service costs per request whatever else runs;
- CPU per request of the service's ASGI app called in this process through httpx's ASGI
  transport (no sockets, no other process; the transport's own CPU included, as in the
  ``/livez`` line): the figure the machine's load disturbs least, best of 3 rounds, for
  one window and for 64 windows over JSON and Arrow, with and without factors.

The client, the workers and whatever else runs on the machine share its cores: the load
average is printed before and after, and belongs beside every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import httpx
import numpy as np
import pandas as pd
import psutil

from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.service import RiskClient
from collapse_guard.service.client import as_raw_run, encode_json
from collapse_guard.service.client.arrow_writer import ARROW_TYPE, encode_runs
from collapse_guard.service.client.transport import KeepAliveTransport
from collapse_guard.signals import signal as signal_spec

__all__ = ["frames_for"]


def frames_for(model: RiskModel, n: int, steps: int = 200, seed: int = 0) -> list[pd.DataFrame]:
    """``n`` windows of ``steps`` steps x every model signal (random walks, seeded), NaN
    where the probe's default periods measure nothing (attention every 10 steps,
    curvature never), as a guarded loop sends them."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        step = np.arange(1000, 1000 + steps)
        cols = {"step": step}
        for name in model.schema.signals:
            walk = 1.0 + 0.05 * np.cumsum(rng.normal(size=steps))
            period = signal_spec(name).period
            cols[name] = (
                np.where(step % period == 0, walk, np.nan) if period else np.full_like(walk, np.nan)
            )
        out.append(pd.DataFrame(cols))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``collapse-guard serve`` in its own process group; SIGTERM on exit."""

    def __init__(self, workers: int) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = Path(sys.executable).with_name("collapse-guard")
        args = [str(command), "serve", "--port", str(self.port), "--workers", str(workers)]
        env = dict(os.environ, BENTOML_DO_NOT_TRACK="true")
        env.pop("COLLAPSE_GUARD_TOKEN", None)
        self.proc = subprocess.Popen(
            args,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.3)
        raise RuntimeError("the service did not become ready in 180 s")

    def __exit__(self, *exc: object) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=30)


def _percentiles(call: Callable[[], object], n: int) -> tuple[float, float]:
    """(p50, p99) in ms of ``n`` calls after 50 warm-up calls."""
    for _ in range(50):
        call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    ms = np.array(times) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def latency(url: str, frame: pd.DataFrame, n: int) -> dict[str, tuple[float, float]]:
    """(p50, p99) in ms of ``n`` one-at-a-time requests, each over a keep-alive connection:
    the client as it comes (Arrow over its KeepAliveTransport: what is measured against
    the target), sending JSON, and on httpx's default transport (httpcore), the window's
    Arrow body sent ready-made through httpx/httpcore (the client's own work taken out), and
    ``GET /livez`` (BentoML's route that does nothing: the floor of the HTTP stack and the
    scheduling)."""
    body = encode_runs([as_raw_run(frame, "run")])
    headers = {"Content-Type": ARROW_TYPE}
    with (
        RiskClient(url, timeout=30) as client,
        RiskClient(url, timeout=30, arrow=False) as json_client,
        RiskClient(url, timeout=30, transport=httpx.HTTPTransport()) as core_client,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        return {
            "client": _percentiles(lambda: client.risk(frame), n),
            "client over JSON": _percentiles(lambda: json_client.risk(frame), n),
            "client on httpcore": _percentiles(lambda: core_client.risk(frame), n),
            "Arrow body ready-made": _percentiles(
                lambda: http.post("/risk?top_k=5", content=body, headers=headers), n
            ),
            "GET /livez": _percentiles(lambda: http.get("/livez"), n),
        }


def server_cpu(server: Server, cases: list[tuple[str, bytes | None, str, int]]) -> dict[str, float]:
    """CPU ms per request of the serving processes themselves (every process of the
    ``serve`` group, from the kernel's counters), one request at a time, best of 3 rounds:
    what the service costs, whatever else the machine runs (10 ms counter ticks:
    ``n`` requests a round keep that below 0.1 ms a request for one window)."""
    root = psutil.Process(server.proc.pid)
    processes = [root, *root.children(recursive=True)]

    def cpu_seconds() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in processes)

    best: dict[str, float] = {}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for label, body, route, n in cases:
            kind, path = route.split(" ")
            for _ in range(3):
                start = cpu_seconds()
                for _ in range(n):
                    if body is None:
                        http.get("/livez").raise_for_status()
                    else:
                        answer = http.post(path, content=body, headers={"Content-Type": kind})
                        answer.raise_for_status()
                ms = 1000 * (cpu_seconds() - start) / n
                best[label] = min(ms, best.get(label, ms))
    return best


def throughput(
    url: str, body: bytes, content_type: str, seconds: float, senders: int, top_k: int
) -> float:
    """Windows per second (64 per body) from ``senders`` concurrent keep-alive clients, on
    RiskClient's transport (KeepAliveTransport: ~0.5 ms less client CPU a request here than
    httpcore, which leaves the workers more of the two cores)."""
    done = [0] * senders
    stop = threading.Event()
    path = f"/risk?top_k={top_k}" if content_type == ARROW_TYPE else "/risk"

    def send(i: int) -> None:
        with httpx.Client(base_url=url, timeout=60, transport=KeepAliveTransport()) as http:
            while not stop.is_set():
                r = http.post(path, content=body, headers={"Content-Type": content_type})
                r.raise_for_status()
                done[i] += 1

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # warm-up: every worker has answered, its memory kept (memory.py)
    first, start = sum(done), time.perf_counter()
    time.sleep(seconds)
    count, elapsed = sum(done) - first, time.perf_counter() - start
    stop.set()
    for t in threads:
        t.join()
    return 64 * count / elapsed


def embedded(model: RiskModel, frames: list[pd.DataFrame], n: int) -> tuple[float, float]:
    """(ms per window one at a time, ms per window in a batch of 64), medians."""
    one = []
    for i in range(n):
        start = time.perf_counter()
        model.predict_window(frames[i % len(frames)], context={})
        one.append(time.perf_counter() - start)
    batch = []
    for _ in range(20):
        start = time.perf_counter()
        model.predict_windows(frames, contexts=[{}] * len(frames))
        batch.append((time.perf_counter() - start) / len(frames))
    return 1000 * float(np.median(one)), 1000 * float(np.median(batch))


def in_process_cpu(
    cases: list[tuple[str, bytes | None, str, int]], rounds: int = 3
) -> dict[str, float]:
    """Best-of-``rounds`` CPU ms per request of the service's ASGI app in this process.

    ``cases``: (label, body or None for ``GET /livez``, "content type path", requests).
    """
    saved = os.environ.get("COLLAPSE_GUARD_RELOAD_FILE")
    os.environ["COLLAPSE_GUARD_RELOAD_FILE"] = str(Path(tempfile.mkdtemp()) / "reload.json")
    try:
        from collapse_guard.service.server.risk_service import RiskService

        return asyncio.run(_cpu_rounds(RiskService.to_asgi(), cases, rounds))
    finally:
        if saved is None:
            os.environ.pop("COLLAPSE_GUARD_RELOAD_FILE", None)
        else:
            os.environ["COLLAPSE_GUARD_RELOAD_FILE"] = saved


async def _cpu_rounds(app: Any, cases: list[Any], rounds: int) -> dict[str, float]:
    inbox: asyncio.Queue = asyncio.Queue()
    outbox: asyncio.Queue = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    lifespan = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    running = asyncio.create_task(app(lifespan, inbox.get, outbox.put))
    await outbox.get()  # started: the model is loaded
    best: dict[str, float] = {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://in-process") as http:
        for _ in range(rounds):
            for label, body, route, n in cases:
                kind, path = route.split(" ")

                async def call(body: Any = body, kind: str = kind, path: str = path) -> None:
                    if body is None:
                        await http.get("/livez")
                        return
                    answer = await http.post(path, content=body, headers={"Content-Type": kind})
                    answer.raise_for_status()

                for _ in range(max(2, n // 10)):  # warm-up
                    await call()
                start = time.process_time()
                for _ in range(n):
                    await call()
                ms = 1000 * (time.process_time() - start) / n
                best[label] = min(ms, best.get(label, ms))
    await inbox.put({"type": "lifespan.shutdown"})
    await running
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="latency samples per setup")
    parser.add_argument("--seconds", type=float, default=10.0, help="per throughput figure")
    parser.add_argument("--senders", type=int, default=4, help="concurrent senders")
    args = parser.parse_args()

    model = RiskModel.load()
    frames = frames_for(model, 64)
    raw = [as_raw_run(f, f"run-{i}") for i, f in enumerate(frames)]
    json_body, arrow_body = encode_json(raw, 5), encode_runs(raw)
    bodies = [  # (label, body, content type, top_k)
        ("JSON, top 5 factors", json_body, "application/json", 5),
        ("Arrow, top 5 factors", arrow_body, ARROW_TYPE, 5),
        ("JSON, no factors", encode_json(raw, 0), "application/json", 0),
        ("Arrow, no factors", arrow_body, ARROW_TYPE, 0),
    ]
    print(f"load average before: {os.getloadavg()}")
    print(f"model {model.meta['version']}, {len(model.schema.signals)} signals, window 200")
    print(f"batch of 64: JSON {len(json_body) / 1e6:.2f} MB, Arrow {len(arrow_body) / 1e6:.2f} MB")
    one_ms, batch_ms = embedded(model, frames, 500)
    print(f"embedded: {one_ms:.3f} ms per window alone, {batch_ms:.3f} ms per window in 64")
    cpu_cases = [
        ("GET /livez", None, "- -", 300),
        ("one window, Arrow", encode_runs(raw[:1]), f"{ARROW_TYPE} /risk?top_k=5", 300),
        ("one window, JSON", encode_json(raw[:1], 5), "application/json /risk", 300),
        *[(f"64 windows, {n}", b, f"{k} /risk?top_k={t}", 30) for n, b, k, t in bodies],
    ]
    for label, ms in in_process_cpu(cpu_cases).items():
        print(f"in process, CPU per request: {label} {ms:.2f} ms")
    for workers in (1, 2):
        with Server(workers) as server:
            if workers == 1:
                for label, ms in server_cpu(server, cpu_cases).items():
                    print(f"served, the service's CPU per request: {label} {ms:.2f} ms")
            figures = latency(server.url, frames[0], args.requests)
            p50, p99 = figures.pop("client")
            print(
                f"{workers} worker(s): one window p50 {p50:.2f} ms, p99 {p99:.2f} ms "
                f"(overhead {p50 / one_ms:.1f}x the embedded window); "
                + ", ".join(f"{k} p50 {a:.2f} / p99 {b:.2f} ms" for k, (a, b) in figures.items())
            )
            if workers == 2:
                for name, body, kind, top_k in bodies:
                    rate = throughput(server.url, body, kind, args.seconds, args.senders, top_k)
                    print(f"2 workers: {rate:,.0f} windows/s over {name} (batches of 64)")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
