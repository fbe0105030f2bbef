"""The bundled model as the reference row of an evaluation of the user's own model.

``collapse-guard evaluate --model M`` scores M beside the baselines; the bundled model on
the same runs says what M gained or lost over what ships with the package. It is shown
only where the comparison is fair: on runs the bundled model never trained or validated
on, at the same horizon, each model at its own stored levels.
"""

from __future__ import annotations

from collections.abc import Sequence

from collapse_guard.predictor.core.seen_runs import SeenRuns
from collapse_guard.predictor.evaluate.scorer import ModelScorer

__all__ = ["REFERENCE", "reference_scorer"]

REFERENCE = "bundled"  # the reference row's scorer name


def reference_scorer(model, run_ids: Sequence[str]) -> tuple[ModelScorer | None, str]:
    """``(scorer, note)``: the bundled model as a scorer named :data:`REFERENCE` and a line
    that says so, or None and the reason it is left out (empty when ``model`` is the
    bundled model itself: there is nothing to compare)."""
    from collapse_guard.predictor.core.risk import RiskModel

    bundled = RiskModel.load()
    version = bundled.meta["version"]
    if version == model.meta["version"]:
        return None, ""
    _, seen = SeenRuns.from_meta(bundled.meta).partition(run_ids)
    n_seen = sum(len(ids) for ids in seen.values())
    if n_seen:
        return None, (
            f"reference left out: the bundled model {version} trained or validated on "
            f"{n_seen} of these {len(run_ids)} runs, so its row would overstate it"
        )
    if bundled.horizon != model.horizon:
        return None, (
            f"reference left out: the bundled model {version} forecasts {bundled.horizon} "
            f"steps ahead, model {model.meta['version']} {model.horizon}"
        )
    return ModelScorer(bundled, name=REFERENCE), (
        f"reference: the bundled model {version} on the same runs, at its own stored levels "
        f"(the '{REFERENCE}' rows)"
    )
