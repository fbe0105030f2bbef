"""Run files, the ground floor: the format, the label, and what reads and keeps run folders.

Every part that writes or reads a run sits above this package (the probe's recorder, the
generators and importers in ``datasets``, the predictor, the guard); it imports none of
them, and no torch: only the shared leaves (``errors``, ``signals``, ``_config``,
``_durable``).

=================  ==========================================================================
module             job
=================  ==========================================================================
``format``         the layout of a run file: its columns, its metadata (:class:`RunMeta`),
                   the schema versions, the errors of a file that is not one
``writer``         run files written durably: :class:`RunWriter` row by row, ``write_run``
``reader``         run files read with checks: ``read_run``, ``read_meta``, ``list_runs``
``label``          the collapse label: onset, kind and spikes of a run (``label_run``)
``censoring``      a guarded run as training data: the rows after the guard acted censored
``lineage``        a resumed run's files: which continue which; a crash's rows set aside
``relabel``        runs labelled under an older label rule brought to the current one
``records``        run files as training and evaluation read them (``load_runs``)
``ingest``         new run files from anywhere fsspec reaches into a dataset folder
``card``           the dataset card: what a folder of run files holds, as tables and a PNG
=================  ==========================================================================
"""

from collapse_guard.runfiles.card import *  # noqa: F403
from collapse_guard.runfiles.card import __all__ as _card
from collapse_guard.runfiles.censoring import *  # noqa: F403
from collapse_guard.runfiles.censoring import __all__ as _censoring
from collapse_guard.runfiles.format import *  # noqa: F403
from collapse_guard.runfiles.format import __all__ as _format
from collapse_guard.runfiles.ingest import *  # noqa: F403
from collapse_guard.runfiles.ingest import __all__ as _ingest
from collapse_guard.runfiles.label import *  # noqa: F403
from collapse_guard.runfiles.label import __all__ as _label
from collapse_guard.runfiles.lineage import *  # noqa: F403
from collapse_guard.runfiles.lineage import __all__ as _lineage
from collapse_guard.runfiles.reader import *  # noqa: F403
from collapse_guard.runfiles.reader import __all__ as _reader
from collapse_guard.runfiles.records import *  # noqa: F403
from collapse_guard.runfiles.records import __all__ as _records
from collapse_guard.runfiles.relabel import *  # noqa: F403
from collapse_guard.runfiles.relabel import __all__ as _relabel
from collapse_guard.runfiles.writer import *  # noqa: F403
from collapse_guard.runfiles.writer import __all__ as _writer

__all__ = sorted(
    [
        *_format,
        *_writer,
        *_reader,
        *_label,
        *_censoring,
        *_lineage,
        *_relabel,
        *_records,
        *_ingest,
        *_card,
    ]
)
