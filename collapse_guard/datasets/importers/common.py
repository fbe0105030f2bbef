"""What every log parser returns, and the number and frame helpers they share.

A parser turns one file into zero or more :class:`ParsedRun`: a frame with one row per
*logged* step (gaps stay gaps: nothing is interpolated), the signals the log has under
their canonical names, and everything else NaN.
"""

from __future__ import annotations

import itertools
import math
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from collapse_guard.signals import SIGNAL_NAMES

__all__ = [
    "HEAD_BYTES",
    "LogParseWarning",
    "NothingToImport",
    "ParsedRun",
    "empty_frame",
    "frame_from_rows",
    "frames_from_table",
    "is_nan_word",
    "parse_number",
    "piece_part",
    "read_head",
    "row_from_fields",
    "runs_from_rows",
    "sniff_lines",
    "split_where_steps_fall",
    "warn_line",
]

# Sniffing reads this much of a file: modded-nanogpt originals start with the whole
# training script and BigScience chronicles with pages of prose before the first log line.
HEAD_BYTES = 256 * 1024

# Text that means "measured, and it was NaN" (a diverged loss) ...
_NAN_WORDS = frozenset({"nan", "-nan", "+nan"})
# ... versus text that means "nothing logged here".
_EMPTY_WORDS = frozenset({"", "none", "null", "na", "n/a", "-"})
# A broken column would otherwise print one warning per row.
_MAX_WARNINGS_PER_COLUMN = 3


class NothingToImport(ValueError):
    """A file of a known format that holds no training curve (e.g. eval metrics only)."""


class LogParseWarning(UserWarning):
    """A file of a known format has a line or value that could not be read; it was skipped."""


@dataclass
class ParsedRun:
    """One run read from a log file.

    ``part`` names the run inside its file ("" when the file holds one run; e.g. "b06"
    for the sixth fenced block of a markdown chronicle) and becomes part of the run id.
    """

    frame: pd.DataFrame
    part: str = ""
    config: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


def read_head(path: Path, n_bytes: int = HEAD_BYTES) -> str:
    """The first ``n_bytes`` of a file as text (undecodable bytes replaced, never an error)."""
    with open(path, "rb") as fh:
        return fh.read(n_bytes).decode("utf-8", errors="replace")


def sniff_lines(path: Path, suffixes: tuple[str, ...], pattern: re.Pattern[str]) -> bool:
    """A line log's sniff: a file with one of ``suffixes`` whose head matches ``pattern``."""
    return path.suffix.lower() in suffixes and bool(pattern.search(read_head(path)))


def warn_line(path: Path, line: int, what: str) -> None:
    """Warn about one unreadable line; the parser skips it and keeps going."""
    warnings.warn(f"{path}:{line}: {what}; line skipped", LogParseWarning, stacklevel=3)


def parse_number(text: object) -> tuple[float, bool]:
    """``(value, ok)`` for one logged value.

    Empty / null means not measured: ``(nan, True)``; so does "nan", and the caller
    flags it with :func:`is_nan_word` (a diverged loss is data). "inf" is a value.
    Anything else unreadable gives ``(nan, False)`` so the caller can warn with the line.
    """
    word = str(text).strip().lower()
    if word in _EMPTY_WORDS or word in _NAN_WORDS:
        return math.nan, True
    try:
        return float(word), True
    except ValueError:
        return math.nan, False


def is_nan_word(text: object) -> bool:
    """True when a logged value says the quantity was measured and was NaN."""
    return str(text).strip().lower() in _NAN_WORDS


def row_from_fields(
    step: int, fields: Mapping[str, str], names: Mapping[str, str]
) -> tuple[dict[str, float], list[str]]:
    """A line log's row: ``(row, unreadable keys)``.

    ``fields`` maps the keys logged on the line to their text, ``names`` maps logged keys
    to signal names. The row holds ``step``, every readable signal, and
    ``loss_nonfinite`` = 1 where the loss was logged as NaN; keys whose text is not a
    number are left out of it and listed, for the parser to warn about.
    """
    row: dict[str, float] = {"step": step}
    unreadable: list[str] = []
    for key, name in names.items():
        if key not in fields:
            continue
        value, ok = parse_number(fields[key])
        if not ok:
            unreadable.append(key)
            continue
        row[name] = value
        if name == "loss" and is_nan_word(fields[key]):
            row["loss_nonfinite"] = 1.0
    return row, unreadable


def frames_from_table(
    path: Path, table: pd.DataFrame, cols: Mapping[str, str], first_line: int = 2
) -> list[pd.DataFrame]:
    """Run frames from a table of *text* cells whose first row is line ``first_line``.

    ``cols`` maps canonical names (``step`` first) to table columns. Text is kept until
    here because an empty cell (not logged) must stay distinct from "nan" (diverged).
    Rows without a step or without any signal value are not logged steps (e.g. eval
    rows) and are dropped; unreadable cells are warned about with their line and skipped.
    A step lower than the one before starts a new run (:func:`split_where_steps_fall`).
    """
    data: dict[str, np.ndarray] = {}
    for canon, col in cols.items():
        text = table[col].astype(str).str.strip()
        low = text.str.lower()
        empty = low.isin(_EMPTY_WORDS).to_numpy()
        nan_word = low.isin(_NAN_WORDS).to_numpy()
        values = pd.to_numeric(text.where(~(empty | nan_word)), errors="coerce").to_numpy()
        bad = np.isnan(values) & ~empty & ~nan_word
        for i in np.flatnonzero(bad)[:_MAX_WARNINGS_PER_COLUMN]:
            warn_line(path, int(i) + first_line, f"{col} = {table[col].iloc[i]!r} is not a number")
        data[canon] = values.astype("float64")
        if canon == "loss":
            data["loss_nonfinite"] = np.where(nan_word, 1.0, np.nan)
    frame = pd.DataFrame(data)
    signals = frame.drop(columns=["step", "loss_nonfinite"])
    keep = np.isfinite(frame["step"].to_numpy()) & (
        signals.notna().any(axis=1).to_numpy() | (frame["loss_nonfinite"] == 1).to_numpy()
    )
    return [
        frame_from_rows(piece) for piece in split_where_steps_fall(frame[keep], repeat_splits=False)
    ]


def frame_from_rows(rows: Iterable[Mapping[str, float]] | pd.DataFrame) -> pd.DataFrame:
    """A run frame (every run-file column) from per-step rows with ``step`` and signal names.

    ``loss_nonfinite`` must already be 1 where the log said the loss was NaN (the value
    alone cannot tell "logged NaN" from "not logged"); here it is completed: 1 where the
    loss is infinite, 0 where a finite loss was logged, NaN where no loss was. Rows are
    sorted by step; a step logged twice keeps the last value logged for each signal
    (e.g. an AlgoPerf eval row at the step of a train row adds nothing but its step).
    """
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if frame.empty:
        return empty_frame()
    if not frame["step"].is_monotonic_increasing or frame["step"].duplicated().any():
        frame = frame.groupby("step", sort=True).last().reset_index()
    n = len(frame)
    data = {"step": frame["step"].to_numpy(dtype=np.int64)}
    for name in SIGNAL_NAMES:
        data[name] = frame[name].to_numpy(dtype=np.float64) if name in frame else np.full(n, np.nan)
    loss, flag = data["loss"], data["loss_nonfinite"]
    flag = np.where(np.isnan(flag) & np.isfinite(loss), 0.0, flag)
    data["loss_nonfinite"] = np.where(np.isinf(loss), 1.0, flag)
    data["event"] = np.full(n, "", dtype=object)
    return pd.DataFrame(data)


def split_where_steps_fall(frame: pd.DataFrame, *, repeat_splits: bool) -> list[pd.DataFrame]:
    """Cut rows (in log order) into runs wherever the step goes backwards.

    A log that restarts its counter holds another run (or a restart from a checkpoint,
    whose replayed steps must not overwrite the history). ``repeat_splits``: a repeated
    step also starts a new run (line logs: one line per step) rather than merging
    (tables: AlgoPerf writes its eval row at the step of a train row).
    """
    steps = frame["step"].to_numpy()
    fell = steps[1:] <= steps[:-1] if repeat_splits else steps[1:] < steps[:-1]
    cuts = [0, *(np.flatnonzero(fell) + 1).tolist(), len(frame)]
    return [frame.iloc[a:b] for a, b in itertools.pairwise(cuts)]


def piece_part(base: str, i: int) -> str:
    """Name of the ``i``-th run (from 1) cut from one file or block: base, base-2, ... / seg2."""
    if i == 1:
        return base
    return f"{base}-{i}" if base else f"seg{i}"


def runs_from_rows(rows: list[Mapping[str, float]], part: str = "") -> list[ParsedRun]:
    """Line logs: one run per stretch of increasing steps (a repeated step is a restart)."""
    if not rows:
        return []
    pieces = split_where_steps_fall(pd.DataFrame(rows), repeat_splits=True)
    return [
        ParsedRun(frame_from_rows(piece), part=piece_part(part, i))
        for i, piece in enumerate(pieces, start=1)
    ]


def empty_frame() -> pd.DataFrame:
    """A run frame with no rows and every column."""
    out = pd.DataFrame({"step": pd.Series([], dtype="int64")})
    for name in SIGNAL_NAMES:
        out[name] = pd.Series([], dtype="float64")
    out["event"] = pd.Series([], dtype="object")
    return out
