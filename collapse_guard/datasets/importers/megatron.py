"""Megatron-LM / Megatron-DeepSpeed iteration lines, in plain logs or pasted into markdown.

A line looks like::

     iteration  29050/ 311541 | ... | learning rate: 9.849E-05 | global batch size: 1024 |
     lm loss: 7.343709E+00 | loss scale: 8192.0 | grad norm: 0.000 | ... |
     number of skipped iterations: 0 | number of nan iterations: 0 |

Mapping: ``lm loss`` (else the first other ``... loss`` field) -> ``loss`` ("nan" sets
``loss_nonfinite``), ``grad norm`` -> ``grad_norm``, ``learning rate`` -> ``lr``,
``loss scale`` -> ``loss_scale``, ``number of skipped iterations`` > 0 -> ``overflow`` = 1
(with fp16 Megatron skips an iteration only when the loss scaler found inf/NaN gradients).

How a file becomes runs:

- Plain logs (.log/.txt/.out): one run per file, cut into a new run wherever the
  iteration counter does not increase (a restart from a checkpoint replays steps).
- Markdown (the BigScience chronicles): one run per fenced block, numbered 1, 2, ...
  in file order (part "b06"), because each block is an excerpt from a different
  experiment, restart or hardware set-up: joining them would fabricate jumps between
  unrelated curves. A block whose iterations go backwards is cut the same way
  ("b06-2"). ``extra["section"]`` holds the heading above the block.

Lines wrapped by a terminal or an editor (the BigScience 176B and 104B excerpts) are
joined back: an iteration line that does not end in ``|`` takes the next lines (up to
three) until one does, unless that line is a new iteration line or a fence.

A grad norm that is exactly 0 on every line of a run is "not reported" (NaN):
Megatron-DeepSpeed printed 0.000 when the DeepSpeed engine did not hand the norm back
(the BigScience 13B run), and a true zero gradient for a whole excerpt is not credible.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from collapse_guard.datasets.importers.common import (
    ParsedRun,
    parse_number,
    row_from_fields,
    runs_from_rows,
    sniff_lines,
    warn_line,
)

__all__ = ["LINE", "NAME", "SUFFIXES", "parse", "parse_line", "sniff"]

NAME = "megatron"
SUFFIXES = (".log", ".txt", ".out", ".md")
LINE = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)")
_SNIFF = re.compile(r"\biteration\s+\d+\s*/\s*\d+\s*\|.*loss", re.IGNORECASE)
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^#{1,6}\s+(.*\S)")
# Megatron field name -> canonical signal name
_FIELDS = {"grad norm": "grad_norm", "learning rate": "lr", "loss scale": "loss_scale"}
_SKIPPED = "number of skipped iterations"
# a Megatron line wraps into at most 3-4 terminal lines; more means it was cut, not wrapped
_MAX_WRAPPED = 3


def sniff(path: Path) -> bool:
    """A text file with at least one ``iteration N/ M | ... loss ...`` line near its start."""
    return sniff_lines(path, SUFFIXES, _SNIFF)


def parse_line(text: str) -> tuple[int, int, dict[str, str]] | None:
    """``(iteration, total, {field: raw value})`` or None when the line is not an iteration line."""
    match = LINE.search(text)
    if match is None:
        return None
    fields: dict[str, str] = {}
    for chunk in match.group(3).split("|"):
        name, sep, value = chunk.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return int(match.group(1)), int(match.group(2)), fields


def _loss_field(fields: dict[str, str]) -> str | None:
    if "lm loss" in fields:
        return "lm loss"
    return next((k for k in fields if k.endswith(" loss") or k == "loss"), None)


def _row(path: Path, lineno: int, step: int, fields: dict[str, str]) -> dict[str, float] | None:
    wanted = dict(_FIELDS)
    loss_key = _loss_field(fields)
    if loss_key:
        wanted[loss_key] = "loss"
    row, unreadable = row_from_fields(step, fields, wanted)
    for key in unreadable:
        warn_line(path, lineno, f"{key!r} = {fields[key]!r} is not a number (wrapped line?)")
    skipped, ok = parse_number(fields.get(_SKIPPED, ""))
    if ok and not np.isnan(skipped):
        row["overflow"] = float(skipped > 0)
    measured = [k for k, v in row.items() if k != "step" and not np.isnan(v)]
    if not measured and "loss_nonfinite" not in row:
        warn_line(path, lineno, "iteration line without any readable value")
        return None
    return row


def _logical_lines(lines) -> Iterator[tuple[int, str]]:
    """``(first line number, text)`` with wrapped iteration lines joined back."""
    pending: tuple[int, str] | None = None
    joined = 0
    for lineno, raw in enumerate(lines, start=1):
        text = raw.rstrip("\n")
        if pending is not None:
            if joined < _MAX_WRAPPED and not LINE.search(text) and not _FENCE.match(text):
                pending, joined = (pending[0], pending[1] + text), joined + 1
                if text.rstrip().endswith("|"):
                    yield pending
                    pending = None
                continue
            yield pending
            pending = None
        if LINE.search(text) and not text.rstrip().endswith("|"):
            pending, joined = (lineno, text), 0
            continue
        yield lineno, text
    if pending is not None:
        yield pending


def parse(path: Path) -> list[ParsedRun]:
    """Runs of the file (see the module docstring for how blocks and restarts split)."""
    markdown = path.suffix.lower() == ".md"
    groups: dict[int, list[dict[str, float]]] = {}
    meta: dict[int, dict] = {}
    block, in_fence, section = 0, False, ""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, text in _logical_lines(fh):
            if markdown and _FENCE.match(text):
                in_fence = not in_fence
                block += in_fence
                continue
            if markdown and not in_fence:
                heading = _HEADING.match(text)
                section = heading.group(1) if heading else section
            parsed = parse_line(text)
            if parsed is None:
                continue
            step, total, fields = parsed
            # outside fences a chronicle's lines are prose quotes: group them by the
            # stretch of prose they sit in (block -n after block n)
            key = block if (in_fence or not markdown) else -block - 1
            row = _row(path, lineno, step, fields)
            if row is None:
                continue
            groups.setdefault(key, []).append(row)
            meta.setdefault(
                key, {"section": section, "total": total, "fields": fields, "line": lineno}
            )
    runs: list[ParsedRun] = []
    for key, rows in groups.items():
        part = (f"b{key:02d}" if key > 0 else f"p{-key - 1:02d}") if markdown else ""
        info = meta[key]
        config = {"train_iters": info["total"]}
        batch, ok = parse_number(info["fields"].get("global batch size", ""))
        if ok and not np.isnan(batch):
            config["global_batch_size"] = int(batch)
        extra = {"first_line": info["line"]}
        if markdown:
            extra["section"] = info["section"]
        for run in runs_from_rows(rows, part):
            # A grad norm of exactly 0 on every line was not reported (module docstring).
            if (run.frame["grad_norm"] == 0).all():
                run.frame["grad_norm"] = np.nan
            run.config, run.extra = dict(config), dict(extra)
            runs.append(run)
    return runs
