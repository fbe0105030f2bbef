"""Find log files, detect their format, parse, label and write them as run files.

Run ids are derived from the file's path relative to the folder given (the folder's
own name included), plus the part inside the file: re-importing the same tree gives
the same ids, so existing run files are kept unless ``force`` is set.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from collapse_guard.datasets.importers import algoperf, megatron, nanogpt, tabular
from collapse_guard.datasets.importers.common import LogParseWarning, NothingToImport, ParsedRun
from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.label import apply_label, label_run
from collapse_guard.runfiles.reader import read_meta
from collapse_guard.runfiles.writer import write_run

__all__ = [
    "FORMATS",
    "MIN_ROWS",
    "ImportReport",
    "detect_format",
    "find_files",
    "import_files",
    "import_logs",
    "run_id",
]

# Most specific first: a modded-nanogpt .txt must not be read as Megatron, and an
# AlgoPerf measurements.csv is also a valid generic CSV (but loses its hparams there).
FORMATS = (algoperf, nanogpt, megatron, tabular)
_BY_NAME = {fmt.NAME: fmt for fmt in FORMATS}
# A run needs two logged steps to have any dynamics; single pasted log lines
# (many chronicle blocks) are quotes, not runs.
MIN_ROWS = 2
# Long ids keep their readable tail and get a hash of the full path (file names <= 255).
_MAX_ID = 180
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def detect_format(path: str | Path) -> str | None:
    """The format name of a log file ("algoperf", "nanogpt", "megatron", "tabular") or None.

    Decided by the file name and by sniffing its first 256 KB; unreadable files are None.
    """
    path = Path(path)
    for fmt in FORMATS:
        try:
            if fmt.sniff(path):
                return fmt.NAME
        except OSError:
            return None
    return None


def run_id(rel: str, part: str = "") -> str:
    """Stable id from a relative path and part: ``a/b/x.md`` + ``b06`` -> ``a__b__x.md__b06``."""
    pieces = [_UNSAFE.sub("_", p) for p in Path(rel).parts if p not in ("", ".", "..")]
    rid = "__".join([*pieces, part] if part else pieces)
    if len(rid) > _MAX_ID:
        digest = hashlib.sha1(rid.encode()).hexdigest()[:10]
        rid = f"{rid[-(_MAX_ID - 11) :].lstrip('_')}-{digest}"
    return rid


def find_files(paths: Iterable[str | Path]) -> list[tuple[Path, str]]:
    """``(file, relative path)`` for every file under ``paths``, sorted, hidden ones left out.

    A folder's files are relative to the folder's parent (so ``realdata/...``); a file
    given by itself keeps the path it was given by (without a leading ``/``), so that
    many ``measurements.csv`` given one by one still get distinct ids.
    """
    found: list[tuple[Path, str]] = []
    for given in map(Path, paths):
        if given.is_dir():
            for file in sorted(given.rglob("*")):
                rel = file.relative_to(given.parent)
                if file.is_file() and not any(p.startswith(".") for p in rel.parts):
                    found.append((file, rel.as_posix()))
        elif given.is_file():
            rel = Path(*given.parts[1:]) if given.is_absolute() else given
            found.append((given, rel.as_posix()))
        else:
            raise FileNotFoundError(
                f"{given}: no such file or folder; pass log files or folders to import"
            )
    return found


@dataclass
class ImportReport:
    """What an import did: the run files, counts by format, and what the label found."""

    runs: list[Path] = field(default_factory=list)  # written now or already there
    written: int = 0
    existing: int = 0
    runs_by_format: Counter = field(default_factory=Counter)
    files_by_format: Counter = field(default_factory=Counter)
    collapses: Counter = field(default_factory=Counter)  # collapse kind -> runs
    spikes: int = 0
    runs_with_spikes: int = 0
    too_short: int = 0  # runs with fewer than MIN_ROWS logged steps
    no_curve: Counter = field(default_factory=Counter)  # format -> files without a curve
    unknown: Counter = field(default_factory=Counter)  # file name -> files of no known format
    failed: int = 0  # files of a known format that could not be parsed (warned)

    def _count(self, fmt: str, meta: RunMeta) -> None:
        self.runs_by_format[fmt] += 1
        if meta.onset_step is not None:
            self.collapses[meta.extra.get("collapse_kind") or "unknown"] += 1
        spikes = len(meta.extra.get("spikes") or ())
        self.spikes += spikes
        self.runs_with_spikes += spikes > 0


def _parse(path: Path, fmt: str, report: ImportReport) -> list[ParsedRun]:
    try:
        return _BY_NAME[fmt].parse(path)
    except NothingToImport:
        report.no_curve[fmt] += 1
    except (OSError, ValueError) as err:  # pandas' ParserError and JSON errors are ValueErrors
        report.failed += 1
        warnings.warn(
            f"{path}: detected as {fmt} but could not be parsed ({err}); file skipped",
            LogParseWarning,
            stacklevel=3,
        )
    return []


def _write(parsed: ParsedRun, rid: str, target: Path, fmt: str, rel: str) -> RunMeta:
    extra = {"origin": rel, "format": fmt, **({"part": parsed.part} if parsed.part else {})}
    meta = RunMeta(
        run_id=rid, source="imported", config=parsed.config, extra={**extra, **parsed.extra}
    )
    meta = apply_label(meta, label_run(parsed.frame))
    write_run(target, parsed.frame, meta)
    return meta


def import_files(
    paths: Iterable[str | Path],
    out: str | Path,
    *,
    force: bool = False,
    on_file: Callable[[Path], None] | None = None,
) -> ImportReport:
    """Import every log under ``paths`` into ``out``; ``on_file`` is called after each file."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = ImportReport()
    for path, rel in find_files(paths):
        fmt = detect_format(path)
        if fmt is None:
            report.unknown[path.name] += 1
        else:
            report.files_by_format[fmt] += 1
            for parsed in _parse(path, fmt, report):
                if len(parsed.frame) < MIN_ROWS:
                    report.too_short += 1
                    continue
                rid = run_id(rel, parsed.part)
                target = out / f"{rid}.parquet"
                if target.exists() and not force:
                    meta = read_meta(target)
                    report.existing += 1
                else:
                    meta = _write(parsed, rid, target, fmt, rel)
                    report.written += 1
                report.runs.append(target)
                report._count(fmt, meta)
        if on_file is not None:
            on_file(path)
    return report


def import_logs(paths: Iterable[str | Path], out: str | Path, *, force: bool = False) -> list[Path]:
    """Import training logs (files or folders, searched recursively) as labelled run files.

    Returns the run files for everything imported, including runs already in ``out``
    from an earlier import (they are kept unless ``force``).
    """
    return import_files(paths, out, force=force).runs
