"""The README's timings, measured: the demo and the quick path, as the README writes them.

    python benchmarks/readme_timings.py [--only demo|quick] [--save FILE] [--load FILE]

Runs ``collapse-guard demo`` and then every quick-path command in order, in a fresh temp
folder (its own ./mlruns), prints each one's wall seconds beside the range the README
quotes for it, and exits 1 if any falls outside. The ranges are parsed from README.md
itself (a command's comment ``...: 26-36 s``, the demo's ``the demo 1-2 min``, the quick
path's ``in all: 3-7 min``), so the two cannot drift apart. ``--save`` writes the seconds
as JSON; ``--load`` checks saved seconds against the README again without running anything
(after the README's ranges changed). Install time is not measured here: a fresh
``make install`` needs a fresh machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["Quoted", "quoted_timings"]

README = Path(__file__).resolve().parents[1] / "README.md"
_RANGE = r"([\d.]+)-([\d.]+) (s|min)\b"
_UNIT = {"s": 1.0, "min": 60.0}

Quoted = tuple[str, float, float]  # what, lowest and highest seconds the README quotes


def _seconds(found: re.Match) -> tuple[float, float]:
    low, high, unit = found.groups()
    return float(low) * _UNIT[unit], float(high) * _UNIT[unit]


def _must(pattern: str, text: str, where: str) -> re.Match:
    found = re.search(pattern, text, flags=re.IGNORECASE)
    if not found:
        raise SystemExit(f"README.md: {where} quotes no time matching {pattern!r}; write one")
    return found


def quoted_timings(text: str) -> list[Quoted]:
    """``("demo", low, high)``, then each quick-path command line (its comment cut) with
    the range in its comment, then ``("quick path in all", low, high)``: seconds."""
    (demo_line,) = [line for line in text.splitlines() if line.startswith("make demo")]
    quoted = [("demo", *_seconds(_must(rf"the demo {_RANGE}", demo_line, "the make demo line")))]
    start = text.index("\n## Quick path")
    section = text[start : text.index("\n## ", start + 1)]
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL):
        for line in block.splitlines():
            command, _, comment = line.partition("  #")
            if command.startswith("collapse-guard "):
                quoted.append((command.strip(), *_seconds(_must(_RANGE, comment, command))))
    total = _must(rf"in all: {_RANGE}", " ".join(section.split()), "the quick path")
    return [*quoted, ("quick path in all", *_seconds(total))]


def _timed(args: list[str], folder: Path) -> float:
    """Wall seconds of one command in ``folder``; a failure stops the measurement."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # ./mlruns
    env.setdefault("OMP_WAIT_POLICY", "passive")  # spinning OpenMP threads (docs/stack.md)
    executable = Path(sys.executable).with_name("collapse-guard")
    start = time.perf_counter()
    done = subprocess.run(
        [str(executable), *args], cwd=folder, env=env, capture_output=True, text=True
    )
    took = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(
            f"{shlex.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    print(f"{took:8.1f} s  {shlex.join(args)}", flush=True)
    return took


def _measure(quoted: list[Quoted], only: str | None) -> dict[str, float]:
    measured: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="readme-timings-") as folder:
        for what, _, _ in quoted:
            if what == "demo" and only != "quick":
                measured[what] = _timed(["demo", "--out", "guard-demo"], Path(folder))
            elif what.startswith("collapse-guard ") and only != "demo":
                measured[what] = _timed(shlex.split(what)[1:], Path(folder))
    steps = [s for what, s in measured.items() if what.startswith("collapse-guard ")]
    if only != "demo":
        measured["quick path in all"] = sum(steps)
    return measured


def _report(quoted: list[Quoted], measured: dict[str, float]) -> int:
    """One line per quoted time it has a measurement of; the number outside its range."""
    outside = 0
    for what, low, high in quoted:
        if what not in measured:
            continue
        took, within = measured[what], low <= measured[what] <= high
        outside += not within
        mark = "ok" if within else "OUTSIDE"
        print(f"{mark:>7}  {took:7.1f} s  quoted {low:.0f}-{high:.0f} s  {what}")
    return outside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", choices=["demo", "quick"], help="time one of the two")
    parser.add_argument("--save", type=Path, help="write the seconds measured as JSON")
    parser.add_argument("--load", type=Path, help="check seconds saved by --save; run nothing")
    args = parser.parse_args()
    quoted = quoted_timings(README.read_text())
    if args.load:
        measured = json.loads(args.load.read_text())
    else:
        measured = _measure(quoted, args.only)
    if args.save:
        args.save.write_text(json.dumps(measured, indent=1))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    outside = _report(quoted, measured)
    print(f"{outside} of {len(measured)} outside the README's ranges")
    sys.exit(1 if outside else 0)


if __name__ == "__main__":
    main()
