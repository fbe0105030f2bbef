"""Run files, the collapse label, and the generators and importers that produce runs.

This package level re-exports the torch-free core: the run-file format
(:mod:`collapse_guard.datasets.runfile`) and the collapse label
(:mod:`collapse_guard.datasets.label`). The real-run generator (``real/``, which
needs torch), the synthetic generator and the importers are imported from their own
modules, so ``import collapse_guard.datasets`` stays light.
"""

from collapse_guard.datasets.label import (
    COLLAPSE_KINDS,
    HORIZON,
    LABEL_VERSION,
    Label,
    LabelRule,
    Spike,
    apply_label,
    collapse_targets,
    label_run,
)
from collapse_guard.datasets.runfile import (
    KNOWN_SCHEMA_VERSIONS,
    META_KEY,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    SOURCES,
    RunFileError,
    RunMeta,
    RunWriter,
    SchemaVersionError,
    list_runs,
    read_meta,
    read_run,
    write_run,
)

__all__ = [
    "COLLAPSE_KINDS",
    "HORIZON",
    "KNOWN_SCHEMA_VERSIONS",
    "LABEL_VERSION",
    "META_KEY",
    "RUN_COLUMNS",
    "SCHEMA_VERSION",
    "SOURCES",
    "Label",
    "LabelRule",
    "RunFileError",
    "RunMeta",
    "RunWriter",
    "SchemaVersionError",
    "Spike",
    "apply_label",
    "collapse_targets",
    "label_run",
    "list_runs",
    "read_meta",
    "read_run",
    "write_run",
]
