"""CSV / TSV / JSONL training logs with step and loss columns under common names.

A column is taken when its name, lower-cased with ``-`` and spaces turned into ``_``,
is one of the aliases below or is already a canonical signal name (a log written with
this project's names imports as is). Every other column is ignored.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd

from collapse_guard.datasets.importers.common import (
    ParsedRun,
    frames_from_table,
    piece_part,
    read_head,
    warn_line,
)
from collapse_guard.signals import SIGNAL_NAMES

__all__ = ["ALIASES", "NAME", "SUFFIXES", "column_map", "parse", "sniff"]

NAME = "tabular"
SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")

# canonical name -> accepted column names (normalised). W&B and Lightning exports use
# "_step", "trainer/global_step" and "train/loss".
ALIASES: dict[str, tuple[str, ...]] = {
    "step": ("step", "steps", "iteration", "iter", "it", "global_step", "_step",
             "trainer/global_step", "train/global_step"),
    "loss": ("loss", "train_loss", "lm_loss", "loss_train", "training_loss", "train/loss",
             "train/lm_loss", "train/loss_step"),
    "grad_norm": ("grad_norm", "gradient_norm", "grad_l2_norm", "gnorm", "grad_norm_l2",
                  "train/grad_norm", "train/gradient_norm"),
    "lr": ("lr", "learning_rate", "train/lr", "train/learning_rate"),
    "loss_scale": ("loss_scale", "loss_scaler", "grad_scale", "train/loss_scale"),
}  # fmt: skip

# JSONL logs often open with a config or eval record: look at this many lines for columns.
_SNIFF_RECORDS = 20


def _normalise(name: str) -> str:
    return name.strip().lower().replace("-", "_").replace(" ", "_")


def column_map(columns: list[str]) -> dict[str, str]:
    """canonical name -> source column, first alias present wins; empty if no step or loss."""
    by_norm: dict[str, str] = {}
    for col in columns:
        by_norm.setdefault(_normalise(col), col)
    found: dict[str, str] = {}
    for canon, names in ALIASES.items():
        for alias in names:
            if alias in by_norm:
                found[canon] = by_norm[alias]
                break
    for name in SIGNAL_NAMES:
        if name in by_norm and name not in found:
            found[name] = by_norm[name]
    return found if {"step", "loss"} <= found.keys() else {}


def _delimiter(header: str) -> str:
    return max(",\t;", key=header.count)


def _head_columns(path: Path) -> list[str]:
    head = read_head(path, 64 * 1024)
    lines = [ln for ln in head.splitlines() if ln.strip()]
    if not lines:
        return []
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        keys: list[str] = []
        for line in lines[:_SNIFF_RECORDS]:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                keys.extend(k for k in record if k not in keys)
        return keys
    return next(csv.reader([lines[0]], delimiter=_delimiter(lines[0])))


def sniff(path: Path) -> bool:
    """A .csv/.tsv/.jsonl whose columns include a step alias and a loss alias."""
    return path.suffix.lower() in SUFFIXES and bool(column_map(_head_columns(path)))


def _read_jsonl(path: Path) -> pd.DataFrame:
    """JSON lines as a table of text cells, one row per line (so warnings name the line)."""
    records: list[dict] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            record: object = {}
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError as err:
                    warn_line(path, lineno, f"not a JSON object ({err})")
            records.append(record if isinstance(record, dict) else {})
    keys = {k for record in records for k in record}
    # a missing key or null is "not logged" (""); a JSON NaN becomes "nan" (diverged)
    table = {k: ["" if r.get(k) is None else str(r[k]) for r in records] for k in keys}
    return pd.DataFrame(table)


def parse(path: Path) -> list[ParsedRun]:
    """One run per file; rows are the logged steps that carry a signal value."""
    cols = column_map(_head_columns(path))
    if not cols:
        return []
    first_line = 2  # a CSV's header is line 1
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        table, first_line = _read_jsonl(path), 1
        cols = {k: v for k, v in cols.items() if v in table}
    else:
        with open(path, encoding="utf-8", errors="replace") as fh:
            sep = _delimiter(fh.readline())
        table = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False,
                            usecols=list(set(cols.values())))  # fmt: skip
    frames = frames_from_table(path, table, cols, first_line)
    return [
        ParsedRun(frame, part=piece_part("", i), extra={"columns": dict(cols)})
        for i, frame in enumerate(frames, start=1)
    ]
