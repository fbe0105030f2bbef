"""Which features a trained model leans on: the top-k by total gain.

For the synthetic-artefact check (issue 8): a feature that carries much of the gain
and separates synthetic collapses only (a generator's precursor, e.g. ``param_norm``
once held 31%) shows up here first.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["feature_gain_table"]


def feature_gain_table(model, k: int = 20) -> pd.DataFrame:
    """The ``k`` features with the most total split gain in ``model`` (a ``RiskModel``).

    Columns: ``feature``, ``signal`` (the signal it is computed from: the name before
    ``__``), ``gain``, ``share`` (of the model's total gain), ``splits`` (times used);
    sorted by gain, ties by name.
    """
    if k < 1:
        raise ValueError(f"k must be a positive number of features; got {k}")
    booster = model.booster
    names = booster.feature_name()
    gain = booster.feature_importance("gain")
    splits = booster.feature_importance("split")
    table = pd.DataFrame({"feature": names, "gain": gain.astype(float), "splits": splits})
    total = table["gain"].sum()
    table["share"] = table["gain"] / total if total > 0 else 0.0
    table["signal"] = table["feature"].str.split("__").str[0]
    table = table.sort_values(["gain", "feature"], ascending=[False, True], kind="stable")
    return table.head(k)[["feature", "signal", "gain", "share", "splits"]].reset_index(drop=True)
