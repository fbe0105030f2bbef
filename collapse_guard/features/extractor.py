"""FeatureExtractor: the public face of the features part.

All methods end in the same kernel (:func:`~collapse_guard.features.stats.grid_features`)
fed by the same grid builder (:mod:`collapse_guard.features.windows`):

- ``transform_window(frame, context)``: one window, "now" = the frame's last row (guard,
  service);
- ``transform_array(values, steps, context)``: the same without pandas, for tight loops;
- ``transform_windows(frames, contexts)``: the last window of many runs at once (a
  service request);
- ``transform_run(frame, stride, steps)``: every stride-th step of a run (training).

The run context (``schema.context``, the last features of the vector) comes from one
accumulator (:mod:`collapse_guard.features.context`). ``transform_run`` feeds it the
whole run and reads it at each window end. The one-window calls take it as given (a
mapping such as ``RunContext.get()``: a missing field is NaN, an unknown one an
error), or, with ``context=None``, compute it from the frame, taken as the whole run
so far (a frame holding only the last window gives a context that knows only that).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from collapse_guard.features.context import context_vector, opt_in_of, run_context
from collapse_guard.features.context_fields import CONTEXT_SIGNALS
from collapse_guard.features.schema import FEATURE_VERSION, FeatureSchema, FeatureSchemaError
from collapse_guard.features.stats import grid_features, window_features
from collapse_guard.features.windows import (
    check_steps,
    dense_grid,
    frame_arrays,
    frame_tail,
    grid_blocks,
)
from collapse_guard.signals import SIGNAL_NAMES, signal

__all__ = ["DEFAULT_WINDOW", "FeatureExtractor"]

# Steps in a feature window. As long as the horizon (runfiles.label.HORIZON) by choice:
# the model sees as far back as it looks ahead.
DEFAULT_WINDOW = 200

# Windows per kernel call in batch mode. One block's grid, 26 signals x (128 + 199)
# steps x 8 bytes = 68 KB, is all a block copies (the dense grid of a whole run never
# exists), and the ~20 µs of Python per call stay about 1% of the block's kernel time.
_BLOCK = 128


class FeatureExtractor:
    """Turn the last ``window`` steps of signals into one feature vector.

    Args:
        window: steps per window (>= 2).
        signals: signal names, in feature order; default every canonical signal.
        extra_context: opt-in run-context fields to compute too
            (``context_fields.OPT_IN_CONTEXT``); default none.

    Frames are ``step`` plus any signal columns (missing signals give NaN features;
    columns that are not signals, like ``event``, are ignored). See
    :mod:`collapse_guard.features.schema` for the feature names and
    :mod:`collapse_guard.features.windows` for the window rule.
    """

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        signals: Sequence[str] = SIGNAL_NAMES,
        extra_context: Sequence[str] = (),
    ):
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 2:
            raise ValueError(
                f"window must be an integer >= 2 (steps); got {window!r}; "
                f"the default is {DEFAULT_WINDOW}"
            )
        signals = tuple(signals)
        if not signals:
            raise ValueError("signals must name at least one signal; got none; omit it for all")
        dupes = sorted({s for s in signals if signals.count(s) > 1})
        if dupes:
            raise ValueError(f"signals must be unique; got duplicates {dupes}; list each once")
        for name in signals:
            try:
                signal(name)
            except KeyError as exc:
                raise ValueError(exc.args[0]) from None
        self.window = int(window)
        self.signals = signals
        self.schema = FeatureSchema.build(self.window, signals, tuple(extra_context))
        self.extra_context = opt_in_of(self.schema.context)
        # the context's input rows that this extractor's signals supply (others NaN)
        self._ctx_signals = tuple(s for s in CONTEXT_SIGNALS if s in signals)
        self._ctx_rows = np.array([signals.index(s) for s in self._ctx_signals], dtype=np.int64)
        self._ctx_slots = np.array(
            [CONTEXT_SIGNALS.index(s) for s in self._ctx_signals], dtype=np.int64
        )

    @classmethod
    def from_schema(cls, schema: FeatureSchema) -> FeatureExtractor:
        """The extractor that reproduces a stored schema exactly, or FeatureSchemaError."""
        if schema.version != FEATURE_VERSION:
            raise FeatureSchemaError(
                f"schema {schema.fingerprint} was made by features version {schema.version}; "
                f"this code computes version {FEATURE_VERSION}; retrain the model or install "
                "the collapse-guard release that made it"
            )
        extractor = cls(schema.window, schema.signals, opt_in_of(schema.context))
        schema.validate(extractor.schema.names)
        return extractor

    def __repr__(self) -> str:
        return (
            f"FeatureExtractor(window={self.window}, signals={len(self.signals)}, "
            f"features={len(self.schema.names)}, schema={self.schema.fingerprint})"
        )

    def transform_window(
        self, frame: pd.DataFrame, context: Mapping[str, float] | None = None
    ) -> np.ndarray:
        """Feature vector ``(n_features,)`` of the window ending at the frame's last row.

        ``context``: the run context at that row (``RunContext.get()``), or None to
        compute it from ``frame`` as the whole run so far.
        """
        steps, values, ctx = self._read(frame, context)
        return np.concatenate([self._one(steps, values), ctx])

    def transform_array(
        self,
        values: np.ndarray,
        steps: np.ndarray | Sequence[int] | None = None,
        context: Mapping[str, float] | None = None,
    ) -> np.ndarray:
        """Like :meth:`transform_window` for ``values`` of shape ``(rows, n_signals)``.

        Columns are ``self.signals`` in order; ``steps`` (strictly increasing) defaults
        to consecutive steps, the last row being "now". ``context=None``: computed from
        ``values`` as the whole run so far.
        """
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != len(self.signals):
            raise ValueError(
                f"values must have shape (rows, {len(self.signals)}), one column per signal "
                f"in extractor.signals order; got {values.shape}"
            )
        steps = np.arange(len(values)) if steps is None else check_steps(steps)
        if len(steps) != len(values):
            raise ValueError(
                f"steps must have one entry per row of values; got {len(steps)} steps for "
                f"{len(values)} rows"
            )
        if context is None:
            if not len(steps):
                raise ValueError(self._empty_message())
            ctx = self._run_context(steps, values.T[self._ctx_rows], steps[-1:])[0]
        else:
            ctx = context_vector(context, self.schema.context)
        return np.concatenate([self._one(steps, values.T), ctx])

    def transform_windows(
        self,
        frames: Sequence[pd.DataFrame],
        contexts: Sequence[Mapping[str, float] | None] | None = None,
    ) -> np.ndarray:
        """``(len(frames), n_features)``: the last window of each frame (e.g. many runs).

        ``contexts``: one per frame (a mapping, or None to compute it from that frame),
        or None for every frame.
        """
        if contexts is None:
            contexts = [None] * len(frames)
        if len(contexts) != len(frames):
            raise ValueError(
                f"contexts must have one entry per frame (None to compute it from the "
                f"frame); got {len(contexts)} contexts for {len(frames)} frames"
            )
        if not len(frames):
            return np.empty((0, len(self.schema.names)), dtype=np.float64)
        parts = [self._read(f, c) for f, c in zip(frames, contexts, strict=True)]
        grids = [self._last_grid(steps, values) for steps, values, _ in parts]
        # (frames, window, signals), as window_features lays windows side by side
        vecs = window_features(np.stack(grids).transpose(0, 2, 1), self.signals)
        ctx = np.stack([c for _, _, c in parts]).reshape(len(frames), -1)
        return np.concatenate([vecs, ctx], axis=1)

    def transform_run(
        self,
        frame: pd.DataFrame,
        stride: int = 1,
        steps: np.ndarray | Sequence[int] | None = None,
    ) -> pd.DataFrame:
        """Features of the windows ending at every ``stride``-th step of a run.

        Window ends are the steps ``first, first + stride, ...`` of the run's step range
        (gaps included), or exactly ``steps`` (each within the run's range). The run
        context at each end is computed from the rows up to it. Returns a float64 frame
        indexed by ``step`` with columns ``schema.names``.
        """
        run_steps, values = frame_arrays(frame, self.signals)
        if not len(run_steps):
            raise ValueError(self._empty_message())
        ends = self._ends(run_steps, stride, steps)
        order = np.argsort(ends, kind="stable")
        out = np.empty((len(ends), len(self.schema.names)), dtype=np.float64)
        n_window = len(self.schema.names) - len(self.schema.context)
        blocks = grid_blocks(run_steps, values, ends[order], self.window, _BLOCK)
        for part, grid, grid_ends in blocks:
            out[order[part], :n_window] = grid_features(grid, grid_ends, self.signals, self.window)
        ctx = self._run_context(run_steps, values[self._ctx_rows], ends[order])
        out[order, n_window:] = ctx
        index = pd.Index(ends, name="step")
        return pd.DataFrame(out, index=index, columns=list(self.schema.names))

    def _read(
        self, frame: pd.DataFrame, context: Mapping[str, float] | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(steps, values, context vector)`` of a frame: its last window's rows and the
        context as given; or, without one, every row (each column is read once) and the
        context computed from them."""
        if context is not None:
            steps, values = frame_tail(frame, self.signals, self.window)
            return steps, values, context_vector(context, self.schema.context)
        steps, values = frame_tail(frame, self.signals, len(frame))
        if not len(steps):
            raise ValueError(self._empty_message())
        return steps, values, self._run_context(steps, values[self._ctx_rows], steps[-1:])[0]

    def _run_context(self, steps: np.ndarray, present: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The context at sorted ``ends`` from the rows of this extractor's context
        signals (``present``: one row per ``_ctx_signals``)."""
        if len(self._ctx_slots) == len(CONTEXT_SIGNALS):  # all there, in that order
            return run_context(self.signals, steps, present, ends, self.extra_context)
        values = np.full((len(CONTEXT_SIGNALS), len(steps)), np.nan)
        values[self._ctx_slots] = present
        return run_context(self.signals, steps, values, ends, self.extra_context)

    def _one(self, steps: np.ndarray, values: np.ndarray) -> np.ndarray:
        grid = self._last_grid(steps, values)
        return grid_features(grid, [self.window - 1], self.signals, self.window)[0]

    def _last_grid(self, steps: np.ndarray, values: np.ndarray) -> np.ndarray:
        if not len(steps):
            raise ValueError(self._empty_message())
        now = int(steps[-1])
        return dense_grid(steps, values, now - self.window + 1, now)

    def _empty_message(self) -> str:
        return (
            "the frame has zero rows; expected at least one step (the last row is 'now'); "
            "call the extractor after the first step has been recorded"
        )

    @staticmethod
    def _ends(run_steps: np.ndarray, stride: int, steps: object) -> np.ndarray:
        first, last = int(run_steps[0]), int(run_steps[-1])
        if steps is None:
            if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
                raise ValueError(f"stride must be an integer >= 1; got {stride!r}")
            return np.arange(first, last + 1, int(stride), dtype=np.int64)
        ends = np.asarray(steps)
        if ends.ndim != 1 or (ends.size and ends.dtype.kind not in "iu"):
            raise ValueError(
                f"steps must be a 1-D array of integer steps; got shape {ends.shape}, "
                f"dtype {ends.dtype}"
            )
        ends = ends.astype(np.int64)
        outside = ends[(ends < first) | (ends > last)]
        if outside.size:
            raise ValueError(
                f"steps must lie within the run's steps {first}..{last}; got "
                f"{outside[:5].tolist()}; drop them or pass a longer frame"
            )
        return ends
