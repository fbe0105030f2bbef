"""A timed mutation fuzz of the served instance: Arrow and JSON bodies, model files on /reload.

    python benchmarks/hostile_fuzz.py --seconds 600      # the figure of benchmarks/README.md

Serves the bundled model (`collapse-guard serve --workers 2`, a token, loopback), then for
``--seconds`` sends byte-mutated Arrow and JSON bodies to /risk and /explain (the mutations
of tests/service/mutations.py) and, every ``--reload-every`` requests, a mutated copy of a
model folder to /reload: bytes of ``model.txt`` or ``risk_model.json`` mutated, or one of
its fields set to a hostile value (NaN, a string, a boolean, a huge or negative number).
Counted: answers by status, 5xx (none allowed), transport failures (a worker that died
drops its connection), worker restarts (their pids), and *silent alarm switches*: a
reload answered 200 whose served model then has levels that are not finite, ordered and
in (0, 1], or a hold out of bounds, or that scores a reference window at a level its own
levels do not give. After each accepted reload the bundled model is reloaded. Prints one
JSON line; exit 1 when anything was counted that must not be.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent / "tests" / "service")]
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from helpers import AUTH, TOKEN, window, worker_pids  # noqa: E402
from mutations import arrow_bases, json_bases, mutate  # noqa: E402
from support import serve_process, wait_ready  # noqa: E402

from collapse_guard.predictor.core.hold import MAX_HOLD_STEPS  # noqa: E402
from collapse_guard.predictor.core.risk import RiskModel  # noqa: E402
from collapse_guard.service.client.arrow_writer import ARROW_TYPE  # noqa: E402

HOSTILE = [math.nan, math.inf, -1.0, 0.0, 1.5, 1e308, "0.5", True, None, [], {"a": 1}, 10**12]


def _model_mutant(good: Path, root: Path, rng: np.random.Generator, case: int) -> Path:
    folder = root / f"m{case}"
    shutil.copytree(good, folder)
    spec_path = folder / "risk_model.json"
    kind = int(rng.integers(0, 3))
    if kind == 0:  # the booster's text
        target = folder / "model.txt"
        target.write_bytes(mutate(target.read_bytes(), rng))
    elif kind == 1:  # the spec's bytes
        spec_path.write_bytes(mutate(spec_path.read_bytes(), rng))
    else:  # one field of the spec set to a hostile value
        spec = json.loads(spec_path.read_text())
        value = HOSTILE[int(rng.integers(0, len(HOSTILE)))]
        where = int(rng.integers(0, 3))
        if where == 0:
            spec["thresholds"][str(rng.choice(sorted(spec["thresholds"])))] = value
        elif where == 1:
            spec["hold_steps"] = value
        else:
            spec[str(rng.choice(sorted(spec)))] = value
        spec_path.write_text(json.dumps(spec, allow_nan=True))
    return folder


def _switched(http: httpx.Client, probe: dict) -> str:
    """Why the served model's levels or answers are no alarm the guard can trust ("" when
    they are)."""
    info = http.get("/model", headers=AUTH).json()
    levels = info.get("thresholds") or {}
    values = [levels.get(k) for k in ("watch", "warn", "critical")]
    if not all(isinstance(v, float | int) and math.isfinite(v) and 0 < v <= 1 for v in values):
        return f"levels {levels}"
    if values != sorted(values):
        return f"levels out of order {levels}"
    hold = info.get("hold_steps")
    if not isinstance(hold, int) or not 0 <= hold <= MAX_HOLD_STEPS:
        return f"hold_steps {hold!r}"
    answer = http.post("/risk", json=probe, headers=AUTH).json()["results"][0]
    p = answer["probability"]
    expected = "ok"
    for name, level in zip(("watch", "warn", "critical"), values, strict=True):
        if p >= level:
            expected = name
    return "" if answer["level"] == expected else f"p={p} answered {answer['level']}"


def fuzz(url: str, server, seconds: float, reload_every: int, good: Path, seed: int) -> dict:
    model = RiskModel.load()
    signals = model.schema.signals
    bases = {"arrow": arrow_bases(signals), "json": json_bases(signals)}
    types = {"arrow": ARROW_TYPE, "json": "application/json"}
    from helpers import run_json

    probe = {"runs": [run_json(window(5, signals), "probe")]}
    rng = np.random.default_rng(seed)
    counts = {"requests": 0, "reloads": 0, "reloads_accepted": 0, "5xx": 0, "transport": 0}
    statuses: dict[str, int] = {}
    switches, failures = [], []
    pids = worker_pids(server)
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=60) as http, tempfile.TemporaryDirectory() as tmp:
        while time.monotonic() < deadline:
            case = counts["requests"]
            if case % reload_every == reload_every - 1:
                source = _model_mutant(good, Path(tmp), rng, case)
                kind, request = "reload", ("/reload", json.dumps({"source": str(source)}).encode())
                headers = AUTH | {"Content-Type": "application/json"}
            else:
                kind = "arrow" if case % 2 else "json"
                body = mutate(bases[kind][case % len(bases[kind])], rng)
                request = ("/explain" if case % 7 == 6 else "/risk", body)
                headers = AUTH | {"Content-Type": types[kind]}
            try:
                status = http.post(request[0], content=request[1], headers=headers).status_code
            except httpx.TransportError as error:
                counts["transport"] += 1
                failures.append((case, kind, repr(error)[:200]))
                continue
            finally:
                counts["requests"] += 1
            statuses[f"{kind}:{status}"] = statuses.get(f"{kind}:{status}", 0) + 1
            if status >= 500:
                counts["5xx"] += 1
                failures.append((case, kind, status))
            if kind == "reload":
                counts["reloads"] += 1
                shutil.rmtree(source, ignore_errors=True)
                if status == 200:
                    counts["reloads_accepted"] += 1
                    why = _switched(http, probe)
                    if why:
                        switches.append((case, why))
                    http.post("/reload", json={"source": str(good)}, headers=AUTH)
    restarted = len(pids - worker_pids(server))
    return {
        **counts,
        "seconds": seconds,
        "worker_restarts": restarted,
        "silent_switches": len(switches),
        "statuses": dict(sorted(statuses.items())),
        "failures": failures[:10],
        "switches": switches[:10],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--reload-every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        good = RiskModel.load().save(folder / "good" / "model")
        env = dict(os.environ, BENTOML_HOME=str(folder / "bentoml"), COLLAPSE_GUARD_TOKEN=TOKEN)
        with serve_process(folder, ["--workers", "2", "--model", str(good)], env) as (
            url,
            proc,
            log,
        ):
            wait_ready(url, proc, log)
            result = fuzz(url, proc, args.seconds, args.reload_every, good, args.seed)
    print(json.dumps(result))
    bad = result["5xx"] + result["transport"] + result["worker_restarts"]
    sys.exit(1 if bad + result["silent_switches"] else 0)


if __name__ == "__main__":
    main()
