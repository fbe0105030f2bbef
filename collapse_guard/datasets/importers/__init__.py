"""Importers: training logs users already have, turned into labelled run files.

Formats (one module each): ``tabular`` (CSV/TSV/JSONL with step and loss columns under
common names), ``megatron`` (Megatron-LM / Megatron-DeepSpeed iteration lines, also
pasted into markdown), ``algoperf`` (MLCommons AlgoPerf ``measurements.csv`` +
``hparams.json``), ``nanogpt`` (modded-nanogpt and llm.c step lines). Only what a log
holds is filled in: every other signal is NaN, and logging gaps stay gaps.

Example::

    from collapse_guard.datasets.importers import import_logs
    paths = import_logs(["logs/"], "runs/imported")
"""

from collapse_guard.datasets.importers.common import LogParseWarning
from collapse_guard.datasets.importers.core import (
    FORMATS,
    ImportReport,
    detect_format,
    import_files,
    import_logs,
    run_id,
)

__all__ = [
    "FORMATS",
    "ImportReport",
    "LogParseWarning",
    "detect_format",
    "import_files",
    "import_logs",
    "run_id",
]
