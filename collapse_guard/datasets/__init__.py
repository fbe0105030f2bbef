"""The generators and importers that produce runs, above the probe.

The real-run generator (``real/``, which needs torch and the probe), the synthetic
generator (``synthetic/``) and the importers of training logs (``importers/``) write run
files; the format they write, the collapse label and what reads run folders live one floor
down, in :mod:`collapse_guard.runfiles`. This package level re-exports the run-file and
label names it always has (so ``import collapse_guard.datasets`` stays light: no torch);
the generators are imported from their own modules.
"""

from collapse_guard.runfiles.format import (
    KNOWN_SCHEMA_VERSIONS,
    META_KEY,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    SOURCES,
    RunFileError,
    RunMeta,
    SchemaVersionError,
)
from collapse_guard.runfiles.label import (
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
from collapse_guard.runfiles.reader import list_runs, read_meta, read_run
from collapse_guard.runfiles.writer import RunWriter, write_run

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
