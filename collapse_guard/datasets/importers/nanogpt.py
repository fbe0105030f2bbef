"""modded-nanogpt speedrun logs and llm.c logs: one ``key:value`` line per step.

- modded-nanogpt: ``step:12/1750 train_loss:5.9012 train_time:1234ms step_avg:98ms``;
  the ``val_loss`` lines every N steps are evaluations, not training steps, and are skipped.
- llm.c: ``s:12 trl:5.9012 lr:0.0006 norm:1.23`` (``norm`` is the gradient norm before
  clipping); the ``s:N tel:X`` lines are evaluations and are skipped.

The original modded-nanogpt logs begin with the whole training script: only lines that
start with one of the two step prefixes are read. A step that goes backwards starts a
new run (a file holding two runs back to back).
"""

from __future__ import annotations

import re
from pathlib import Path

from collapse_guard.datasets.importers.common import (
    ParsedRun,
    row_from_fields,
    runs_from_rows,
    sniff_lines,
    warn_line,
)

__all__ = ["NAME", "SUFFIXES", "parse", "sniff"]

NAME = "nanogpt"
SUFFIXES = (".log", ".txt", ".out")
_TRAIN = re.compile(r"^(?:step:\d+/\d+\s.*\btrain_loss:|s:\d+\s+trl:)", re.MULTILINE)
_STEP = re.compile(r"^(?:step:(\d+)/(\d+)|s:(\d+))\s")
# logged key -> canonical signal name (train lines only)
_KEYS = {"train_loss": "loss", "trl": "loss", "lr": "lr", "norm": "grad_norm"}


def sniff(path: Path) -> bool:
    """A text file with a modded-nanogpt ``train_loss`` or llm.c ``trl`` step line."""
    return sniff_lines(path, SUFFIXES, _TRAIN)


def _parse_train_line(path: Path, lineno: int, text: str) -> dict[str, float] | None:
    """The row of a train line; None for eval lines and lines of other kinds."""
    match = _STEP.match(text)
    if match is None:
        return None
    fields = dict(tok.split(":", 1) for tok in text[match.end() :].split() if ":" in tok)
    if "train_loss" not in fields and "trl" not in fields:
        return None  # an evaluation line (val_loss / tel)
    row, unreadable = row_from_fields(int(match.group(1) or match.group(3)), fields, _KEYS)
    if unreadable:
        key = unreadable[0]
        warn_line(path, lineno, f"{key}:{fields[key]} is not a number")
        return None
    return row


def parse(path: Path) -> list[ParsedRun]:
    """One run per file (more when the step counter restarts)."""
    rows: list[dict[str, float]] = []
    total = None
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, text in enumerate(fh, start=1):
            row = _parse_train_line(path, lineno, text)
            if row is None:
                continue
            if total is None and (match := _STEP.match(text)) and match.group(2):
                total = int(match.group(2))
            rows.append(row)
    runs = runs_from_rows(rows)
    for run in runs:
        run.config = {"train_steps": total} if total is not None else {}
        run.extra = {"record": path.parent.name}
    return runs
