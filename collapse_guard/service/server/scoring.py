"""Checked windows in, answers out: probability, level and contributing features.

One feature matrix per request: probabilities and LightGBM contributions come from the
same rows, and a row's probability does not depend on the other rows of the batch, so
each answer equals ``RiskModel.predict_window`` on that run alone, to the bit (tested).

Per-window Python is what a batch costs beyond the model (measured on 64 windows of 200
steps, loaded 2-core machine): so the runs arrive as one batch (windows.WindowBatch) laid on
one feature grid by one gather per signal, the features are one kernel call, the
contributions one call of the leaf-table kernel (treeshap.py), the top factors one
``argsort``, and the answer is plain values written by one encoder call, never pydantic
objects of numbers this code computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pydantic_core

from collapse_guard.features.stats import grid_features
from collapse_guard.predictor.core.levels import CRITICAL, Level
from collapse_guard.service.client.wire import (
    ExplainResponse,
    FeatureContribution,
    SignalContribution,
)
from collapse_guard.service.server.treeshap import LeafTables
from collapse_guard.service.server.treeshap import build as build_tables
from collapse_guard.service.server.windows import WindowBatch

__all__ = ["ServedModel", "answers_json", "signal_of"]


def signal_of(feature: str) -> str:
    """The signal a feature belongs to: ``loss__mean`` -> ``loss``, ``dsi__count`` -> ``dsi``
    (the three DSI signals together), ``ctx__lr_over_peak`` -> ``context`` (the run's)."""
    prefix = feature.split("__", 1)[0]
    return "context" if prefix == "ctx" else prefix


def answers_json(answers: list[dict[str, Any]]) -> bytes:
    """The ``RiskResponse`` body of :meth:`ServedModel.answers`."""
    # pydantic's Rust encoder: 0.23 ms for 64 answers against json.dumps' 0.68 here
    # (shortest round-trip floats, like json); a non-finite number, a bug, would be null
    return pydantic_core.to_json({"results": answers})


def _reasons(batch: WindowBatch) -> list[str | None]:
    return batch.reasons or [None] * len(batch)


@dataclass(frozen=True)
class ServedModel:
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

    def features(self, batch: WindowBatch) -> np.ndarray:
        """``(len(batch), n_features)``, as ``FeatureExtractor.transform_windows`` lays
        them out: every run's window side by side on one grid, one kernel call for the
        batch (bit-equal to ``transform_window`` per run: tests/features, and ``_check``
        at load).

        A run's context is used as given; a request without one gives NaN context
        features (never computed from a window that is not the whole run). No pandas
        frame per run (~1 ms each here) and no kernel call per run.
        """
        width = self.model.schema.window
        values = grid_features(
            self._grid(batch), np.arange(1, len(batch) + 1) * width - 1, self.signals, width
        )
        return np.concatenate([values, batch.contexts], axis=1)

    def _grid(self, batch: WindowBatch) -> np.ndarray:
        """``(n_signals, len(batch) * width)``: run i's window in columns ``i * width ..
        (i + 1) * width - 1``, the column of step s being ``s - (last step - width + 1)``
        (dense_grid's), NaN where a step or signal is missing."""
        width = self.model.schema.window
        run = np.repeat(np.arange(len(batch)), np.diff(batch.bounds))
        column = batch.steps - (batch.last_steps - width + 1)[run]  # < 0: before the window
        inside = column >= 0
        grid = np.empty((len(self.signals), len(batch) * width))
        # every run exactly its window's steps (the usual request): each column is the
        # grid's row as it is (a run has at most `width` steps inside, all distinct)
        whole = len(column) == grid.shape[1] and bool(inside.all())
        if not whole:
            grid.fill(np.nan)
            source = np.flatnonzero(inside)
            target = run[source] * width + column[source]
        for j, name in enumerate(self.signals):
            values = batch.columns.get(name)
            if values is None:
                grid[j] = np.nan
            elif whole:
                grid[j] = values
            else:
                grid[j, target] = values[source]
        return grid

    def answers(self, batch: WindowBatch, top_k: int = 5) -> list[dict[str, Any]]:
        """One answer per run, in order, as ``RiskResult``'s fields in plain values.

        Plain values rather than pydantic objects (``model_construct`` was ~10 us an
        object: 2.5-4 ms of a 64-run answer here); :func:`answers_json` writes them and a
        test holds the result to the ``RiskResponse`` schema.
        """
        X = self.features(batch)
        probabilities = self.model.predict_features(X).tolist()
        factors = self._top_factors(X, top_k) if top_k > 0 else [[] for _ in probabilities]
        common = {
            "horizon": self.model.horizon,
            "hold_steps": self.model.hold_steps,
            "model_name": self.name,
            "model_version": self.version,
        }
        return [
            {
                "run_id": run_id,
                "step": step,
                "probability": p,
                "level": self._level(p, reason),
                **common,
                "top_factors": top,
                "reason": reason,
            }
            for run_id, step, p, top, reason in zip(
                batch.run_ids,
                batch.last_steps.tolist(),
                probabilities,
                factors,
                _reasons(batch),
                strict=True,
            )
        ]

    def _level(self, probability: float, reason: str | None) -> Level:
        # a measured collapse now outranks any forecast (collapse_now.nonfinite_reason)
        return CRITICAL if reason is not None else self.model.level(probability)

    def _top_factors(self, X: np.ndarray, top_k: int) -> list[list[dict[str, Any]]]:
        """The ``top_k`` largest |contribution| features of each row (ties: column order),
        as ``Factor`` fields."""
        contrib = self._contributions(X)
        order = np.argsort(-np.abs(contrib), axis=1, kind="stable")[:, :top_k]
        values = np.take_along_axis(contrib, order, axis=1).tolist()
        names, signals = self.model.schema.names, self._feature_signals
        return [
            [
                {"feature": names[j], "signal": signals[j], "contribution": c}
                for j, c in zip(columns, row, strict=True)
            ]
            for columns, row in zip(order.tolist(), values, strict=True)
        ]

    def explain(self, batch: WindowBatch) -> ExplainResponse:
        """Every feature's contribution for the window of a batch's one run, by signal."""
        if len(batch) != 1:
            raise ValueError(f"explain reads one run; got {len(batch)}")
        X = self.features(batch)
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
        reason = _reasons(batch)[0]
        return ExplainResponse(
            run_id=batch.run_ids[0],
            step=int(batch.last_steps[0]),
            probability=p,
            level=self._level(p, reason),
            reason=reason,
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
        from the leaf tables when the booster has them (treeshap.py: ~0.05 ms for one
        window, ~1 ms for 64, against ``pred_contrib``'s 0.4 and 22-29), else from
        ``pred_contrib`` itself."""
        tables = self._shap_tables
        if tables is not None:
            return tables.contributions(X)
        return self.model.booster.predict(X, pred_contrib=True, num_threads=1)[:, :-1]
