"""The run-file format: one training run = one Parquet file, its columns and its metadata.

Layout (docs/design.md, "Run files"):

==================  =========  ====================================================
column              type       what
==================  =========  ====================================================
``step``            int64      training step, strictly increasing (gaps allowed)
every signal name   float64    one column per ``collapse_guard.signals.SIGNAL_NAMES``,
                    (float32)  in that order; NaN = not measured at this step
``event``           string     empty, or what the guard did at this step
==================  =========  ====================================================

A *compact* file (``write_run(..., compact=True)``: the corpus pack, real runs) stores a
signal as float32 unless it is one of ``EXACT_SIGNALS`` whose values float32 would
round; its floats are byte-stream-split before zstd. Readers hand every signal back as
float64 either way: a float32 value widens exactly, so a compact file reads as the
same numbers as a float64 file of the same run wherever the values were float32 to
begin with (everything the probe measures in torch's float32).

The file's key-value metadata holds JSON under the key ``collapse_guard``: the
fields of :class:`RunMeta` (``run_id``, ``source``, ``config``, ``onset_step``,
``label_version``, ``schema_version``, ``extra``).

:mod:`~collapse_guard.runfiles.writer` writes run files durably,
:mod:`~collapse_guard.runfiles.reader` reads them with checks; the errors below name the
file, what is wrong and what to do.

Example::

    meta = RunMeta(run_id="lr0.05-seed1", source="real", config={"lr": 0.05})
    with RunWriter("runs/lr0.05-seed1.parquet", meta) as writer:
        for step in range(1000):
            writer.append(step, {"loss": 2.5, "grad_norm": 0.8})
    frame, meta = read_run("runs/lr0.05-seed1.parquet")
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from collapse_guard.errors import UserInputError
from collapse_guard.signals import SIGNAL_NAMES

__all__ = [
    "EXACT_SIGNALS",
    "KNOWN_SCHEMA_VERSIONS",
    "META_KEY",
    "RUN_COLUMNS",
    "SCHEMA_VERSION",
    "SOURCES",
    "RunFileError",
    "RunMeta",
    "SchemaVersionError",
    "UnreadableRunFile",
]

SCHEMA_VERSION: int = 1
# Versions this reader understands. A newer writer bumps SCHEMA_VERSION; an old reader
# must refuse its files rather than misread them.
KNOWN_SCHEMA_VERSIONS: tuple[int, ...] = (1,)
SOURCES: tuple[str, ...] = ("synthetic", "real", "imported", "guarded")
RUN_COLUMNS: tuple[str, ...] = ("step", *SIGNAL_NAMES, "event")
META_KEY: str = "collapse_guard"
# Signals a compact file keeps float64 unless float32 holds them exactly: the label reads
# the loss (a rise of 0.25 nats over its EWMA best) and the gradient norm (a 1000x drop),
# and LR rises are found from the LR's step-to-step changes (run context, the evaluation's
# rows inside rises), where float32 rounding could make two LRs equal. The probe measures
# loss and gradient norm in float32, so in its runs only the LR stays float64.
EXACT_SIGNALS: tuple[str, ...] = ("loss", "lr", "grad_norm")


class RunFileError(ValueError):
    """A run file (or data meant for one) is not what collapse-guard expects.

    The message names the file, what is wrong and what to do about it.
    """


class UnreadableRunFile(RunFileError, UserInputError):
    """A file given to be read as a run file is damaged, foreign or too new: bad input,
    which the command line prints as one line (a writer's misuse stays a plain
    :class:`RunFileError`, a bug in the calling code)."""


class SchemaVersionError(UnreadableRunFile):
    """The file was written with a schema version this reader does not know."""


# --------------------------------------------------------------------------- metadata


@dataclass
class RunMeta:
    """What a run file says about itself (stored as JSON in the Parquet footer)."""

    run_id: str
    source: str  # one of SOURCES
    config: dict = field(default_factory=dict)  # model / optimizer settings
    onset_step: int | None = None  # first step of collapse (label.py), None if healthy
    label_version: str | None = None  # label.LABEL_VERSION that set onset_step
    schema_version: int = SCHEMA_VERSION
    extra: dict = field(default_factory=dict)  # free-form: collapse_kind, spikes, fault, ...

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not self.run_id:
            raise ValueError(f"RunMeta.run_id must be a non-empty string, got {self.run_id!r}")
        if self.source not in SOURCES:
            raise ValueError(
                f"RunMeta.source must be one of {', '.join(SOURCES)}, got {self.source!r}"
            )
        if self.onset_step is not None:
            if isinstance(self.onset_step, bool) or not isinstance(
                self.onset_step, (int, np.integer)
            ):
                raise ValueError(
                    f"RunMeta.onset_step must be an int or None, got {self.onset_step!r}"
                )
            self.onset_step = int(self.onset_step)
        if not isinstance(self.config, dict) or not isinstance(self.extra, dict):
            raise ValueError(
                "RunMeta.config and RunMeta.extra must be dicts, got "
                f"{type(self.config).__name__} and {type(self.extra).__name__}"
            )

    def to_json(self) -> str:
        """The JSON stored under ``collapse_guard`` in the file's metadata."""
        try:
            return json.dumps(asdict(self), default=_json_default, sort_keys=True)
        except TypeError as exc:
            raise RunFileError(
                f"run {self.run_id!r}: metadata is not JSON-serialisable ({exc}); "
                "store plain str/int/float/bool/list/dict values in config and extra"
            ) from None

    @classmethod
    def from_json(cls, text: str | bytes, *, path: str | os.PathLike = "<memory>") -> RunMeta:
        """Parse and validate metadata; errors name ``path`` and do not check the version."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UnreadableRunFile(
                f"{path}: the {META_KEY!r} metadata is not valid JSON ({exc}); "
                "the file is damaged: regenerate or re-import the run"
            ) from None
        if not isinstance(data, dict):
            raise UnreadableRunFile(f"{path}: the {META_KEY!r} metadata is not a JSON object")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            # A known schema version never carries unknown fields; keep them rather
            # than lose them, where a later reader can see them.
            data.setdefault("extra", {})
            data["extra"] = {**data["extra"], "_unknown_meta": {k: data[k] for k in unknown}}
            for k in unknown:
                del data[k]
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise UnreadableRunFile(f"{path}: invalid run metadata: {exc}") from None


def _json_default(value: Any) -> Any:
    """numpy scalars, arrays, paths and tuples-in-sets become plain JSON values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (os.PathLike, set, frozenset)):
        return str(value) if isinstance(value, os.PathLike) else sorted(value)
    raise TypeError(f"{type(value).__name__} value {value!r} cannot be stored as JSON")
