"""Checked windows in, answers out: probability, level and contributing features.

One feature matrix per request: probabilities and LightGBM contributions come from the
same rows, and a row's probability does not depend on the other rows of the batch, so
each answer equals ``RiskModel.predict_window`` on that run alone, to the bit (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collapse_guard.service.runs import RunWindow
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

    def features(self, windows: Sequence[RunWindow]) -> np.ndarray:
        """``(len(windows), n_features)`` through the model's own extractor.

        A window's context is used as given; a request without one gives ``{}``, so its
        context features are NaN (never computed from a window that is not the whole run).
        Each row is ``transform_array``, the array twin of the ``transform_window`` that
        ``RiskModel.predict_window`` uses: no pandas frame per run (~1 ms each here).
        """
        extractor = self.model.extractor
        return np.stack([extractor.transform_array(*self._array(w), w.context) for w in windows])

    def _array(self, window: RunWindow) -> tuple[np.ndarray, np.ndarray]:
        # only the last `window` rows can fall in the window (steps strictly increase)
        start = max(len(window.steps) - self.model.schema.window, 0)
        steps = window.steps[start:]
        values = np.full((len(steps), len(self.signals)), np.nan)
        for j, name in enumerate(self.signals):
            column = window.columns.get(name)
            if column is not None:
                values[:, j] = column[start:]
        return values, steps

    def score(self, windows: Sequence[RunWindow], top_k: int = 5) -> list[RiskResult]:
        """One answer per window, in order."""
        X = self.features(windows)
        probabilities = self.model.predict_features(X)
        contrib = self._contributions(X) if top_k > 0 else None
        names = self.model.schema.names
        out = []
        for i, (window, p) in enumerate(zip(windows, probabilities, strict=True)):
            factors = []
            if contrib is not None:
                row = contrib[i]
                for j in np.argsort(-np.abs(row), kind="stable")[:top_k]:
                    feature = names[j]
                    factors.append(
                        Factor(feature=feature, signal=signal_of(feature), contribution=row[j])
                    )
            out.append(
                RiskResult(
                    run_id=window.run_id,
                    step=window.step,
                    probability=float(p),
                    level=self.model.level(float(p)),
                    horizon=self.model.horizon,
                    model_name=self.name,
                    model_version=self.version,
                    top_factors=factors,
                )
            )
        return out

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

    def _contributions(self, X: np.ndarray) -> np.ndarray:
        # SHAP values on the raw log-odds scale; the last column is the expected value
        return self.model.booster.predict(X, pred_contrib=True, num_threads=1)[:, :-1]
