"""Checked windows in, answers out: probability, level and contributing features.

One feature matrix per request: probabilities and LightGBM contributions come from the
same rows, and a row's probability does not depend on the other rows of the batch, so
each answer equals ``RiskModel.predict_window`` on that run alone, to the bit (tested).

Per-window Python is what a batch costs beyond the model (measured on 64 windows of 200
steps, loaded 2-core machine): so the features are one kernel call on one grid for the
whole batch, the contributions one call of the leaf-table kernel (treeshap.py), the top
factors one ``argsort``, and the answers are built without re-validating numbers this
code computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from collapse_guard.features.context import context_vector
from collapse_guard.features.stats import grid_features
from collapse_guard.service.runs import RunWindow
from collapse_guard.service.treeshap import LeafTables
from collapse_guard.service.treeshap import build as build_tables
from collapse_guard.service.wire import (
    ExplainResponse,
    Factor,
    FeatureContribution,
    RiskResult,
    SignalContribution,
)

__all__ = ["Scorer", "signal_of"]


def signal_of(feature: str) -> str:
    """The signal a feature belongs to: ``loss__mean`` -> ``loss``, ``dsi__count`` -> ``dsi``
    (the three DSI signals together), ``ctx__lr_over_peak`` -> ``context`` (the run's)."""
    prefix = feature.split("__", 1)[0]
    return "context" if prefix == "ctx" else prefix


@dataclass(frozen=True)
class Scorer:
    """A loaded model and the name and version its answers carry."""

    model: object  # RiskModel (typed loosely: importing it here would load lightgbm early)
    name: str
    version: str

    @property
    def signals(self) -> tuple[str, ...]:
        return tuple(self.model.schema.signals)

    @property
    def context_fields(self) -> tuple[str, ...]:
        return tuple(self.model.schema.context)

    @cached_property
    def _feature_signals(self) -> tuple[str, ...]:
        # the signal of each feature column, for the answers' top factors
        return tuple(signal_of(name) for name in self.model.schema.names)

    def features(self, windows: Sequence[RunWindow]) -> np.ndarray:
        """``(len(windows), n_features)``, as ``FeatureExtractor.transform_windows`` lays
        them out: every window's dense grid side by side, one kernel call for the batch
        (bit-equal to ``transform_window`` per run: tests/features, and ``_check`` at load).

        A window's context is used as given; a request without one gives ``{}``, so its
        context features are NaN (never computed from a window that is not the whole run).
        No pandas frame per run (~1 ms each here) and no kernel call per run (64 windows:
        ~3 ms instead of ~8 ms of per-call overhead).
        """
        schema, width = self.model.schema, self.model.schema.window
        # the windows side by side on one step grid, written in place: window i ends at
        # column (i + 1) * width - 1 (window_features' layout, without its stack and
        # transposed copy, nor a grid per window: ~4.6 -> ~1.5 ms for 64 windows here)
        grid = np.full((len(self.signals), len(windows) * width), np.nan)
        for i, window in enumerate(windows):
            self._place(window, grid[:, i * width : (i + 1) * width])
        ends = np.arange(1, len(windows) + 1) * width - 1
        values = grid_features(grid, ends, self.signals, width)
        contexts = [context_vector(w.context, schema.context) for w in windows]
        return np.concatenate([values, np.stack(contexts).reshape(len(windows), -1)], axis=1)

    def _place(self, window: RunWindow, out: np.ndarray) -> None:
        """Write the window ending at its last step into ``out`` ``(n_signals, width)``,
        NaN-filled: the column of step s is ``s - (now - width + 1)`` (dense_grid's)."""
        width = out.shape[1]
        # only the last `width` rows can fall in the window (steps strictly increase)
        start = max(len(window.steps) - width, 0)
        steps = window.steps[start:]
        first = int(steps[-1]) - width + 1
        if steps[-1] - steps[0] == len(steps) - 1:  # one row per step (the usual log)
            at: slice | np.ndarray = slice(int(steps[0]) - first, width)
        else:  # gaps: rows before the window's first step fall out
            inside = int(np.searchsorted(steps, first))
            start, at = start + inside, steps[inside:] - first
        for j, name in enumerate(self.signals):
            column = window.columns.get(name)
            if column is not None:
                out[j, at] = column[start:]

    def score(self, windows: Sequence[RunWindow], top_k: int = 5) -> list[RiskResult]:
        """One answer per window, in order."""
        X = self.features(windows)
        probabilities = self.model.predict_features(X).tolist()
        factors = self._top_factors(X, top_k) if top_k > 0 else [[] for _ in windows]
        # model_construct: every field is a number or name computed here (no validation)
        return [
            RiskResult.model_construct(
                run_id=window.run_id,
                step=window.step,
                probability=p,
                level=self.model.level(p),
                horizon=self.model.horizon,
                model_name=self.name,
                model_version=self.version,
                top_factors=top,
            )
            for window, p, top in zip(windows, probabilities, factors, strict=True)
        ]

    def _top_factors(self, X: np.ndarray, top_k: int) -> list[list[Factor]]:
        """The ``top_k`` largest |contribution| features of each row (ties: column order)."""
        contrib = self._contributions(X)
        order = np.argsort(-np.abs(contrib), axis=1, kind="stable")[:, :top_k]
        values = np.take_along_axis(contrib, order, axis=1).tolist()
        names, signals = self.model.schema.names, self._feature_signals
        return [
            [
                Factor.model_construct(feature=names[j], signal=signals[j], contribution=c)
                for j, c in zip(columns, row, strict=True)
            ]
            for columns, row in zip(order.tolist(), values, strict=True)
        ]

    def explain(self, window: RunWindow) -> ExplainResponse:
        """Every feature's contribution for one window, grouped by signal."""
        X = self.features([window])
        p = float(self.model.predict_features(X)[0])
        full = self.model.booster.predict(X, pred_contrib=True, num_threads=1)[0]
        contrib, base = full[:-1], float(full[-1])
        groups: dict[str, list[FeatureContribution]] = {}
        for name, value, c in zip(self.model.schema.names, X[0], contrib, strict=True):
            item = FeatureContribution(
                feature=name, value=float(value) if np.isfinite(value) else None, contribution=c
            )
            groups.setdefault(signal_of(name), []).append(item)
        signals = [
            SignalContribution(signal=s, contribution=sum(f.contribution for f in fs), features=fs)
            for s, fs in groups.items()
        ]
        signals.sort(key=lambda g: -abs(g.contribution))
        return ExplainResponse(
            run_id=window.run_id,
            step=window.step,
            probability=p,
            level=self.model.level(p),
            model_name=self.name,
            model_version=self.version,
            base_log_odds=base,
            log_odds=base + float(contrib.sum()),
            signals=signals,
        )

    @cached_property
    def _shap_tables(self) -> LeafTables | None:
        # built when the model is loaded and checked (model_state), not on a request
        return build_tables(self.model.booster)

    def _contributions(self, X: np.ndarray) -> np.ndarray:
        """LightGBM's TreeSHAP values on the raw log-odds scale (expected value left out):
        from the leaf tables when the booster has them (treeshap.py: 0.1 ms a window
        instead of 0.45), else from ``pred_contrib`` itself."""
        tables = self._shap_tables
        if tables is not None:
            return tables.contributions(X)
        return self.model.booster.predict(X, pred_contrib=True, num_threads=1)[:, :-1]
