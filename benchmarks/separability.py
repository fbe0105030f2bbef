"""How well each signal group's features, one at a time, tell the rows before a collapse
from healthy rows, per set-up: a model-free account of "why" per signal.

The rows are the training rows (``training.data.build_training_data``): a window's
features every ``stride`` steps, target 1 within the horizon before onset (a sudden
collapse's last rows are not among them), 0 before that and on healthy runs. For each
set-up group (e.g. each optimizer) and each feature, the ROC-AUC of the feature alone
over that group's rows, read in whichever direction separates (``max(auc, 1 - auc)``:
0.5 is no information, 1 a perfect single threshold); then, per signal group, its best
feature. Where a group's best is near 0.5 under one optimizer and well above under
another, that optimizer's collapses give that group nothing to forecast from.

The signal groups are :func:`group_leads.signal_groups`, with the run context
(``ctx__*``) and the DSI count (``dsi__*``) as groups of their own.

Inside LR rises (issue 34, item 5): ``features.rises.rows_in_lr_rise`` says which rows end at
a step whose LR rose within the horizon (the evaluation's definition), so a
table can be made of those rows alone: there a healthy run's warm-up and re-warms stand
beside the collapses, and a feature that reads "the LR is rising" no longer separates.

The noise floor (:func:`permuted_targets`): the best of many features, read in either
direction, on few runs, stands well above 0.5 by chance alone (issue 34: on 22 outside
runs, random run labels scored as high as the true ones). So each table is made again with
the runs' outcomes shuffled among the runs of each set-up group, positives kept at the
end of the run as a collapse's are; a signal group informs only where it stands clear of
its own score there.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from group_leads import signal_groups
from sklearn.metrics import roc_auc_score

__all__ = ["MIN_ROWS", "feature_group", "permuted_targets", "separability"]

MIN_ROWS = 100  # finite rows a feature needs in a group (both targets present) to be scored


def feature_group(name: str, group_of: Mapping[str, str] | None = None) -> str:
    """The signal group a feature reads: its signal's, ``context`` or ``dsi``."""
    prefix = name.split("__", 1)[0]
    if prefix == "ctx":
        return "context"
    if prefix == "dsi":
        return "dsi"
    return (group_of or signal_groups()).get(prefix, prefix)


def permuted_targets(
    y: np.ndarray, runs: np.ndarray, steps: np.ndarray, group: np.ndarray, seed: int = 0
) -> np.ndarray:
    """The targets with the runs' outcomes shuffled among the runs of each ``group``.

    Each run holds a count of positive rows (0 for a healthy run: its pre-collapse rows,
    the last ones before onset, for a collapse). The counts are permuted among the runs
    of a group, and a run given count k has its last k rows (by step) positive, all of
    them where it has fewer: what a feature that reads "late in a run of this set-up"
    scores when the collapses are random runs.
    """
    y, runs, steps, group = (np.asarray(a) for a in (y, runs, steps, group))
    rng = np.random.default_rng(seed)
    out = np.zeros(len(y), dtype=y.dtype)
    for g in np.unique(group):
        ids = np.unique(runs[group == g])
        counts = np.array([int(y[runs == r].sum()) for r in ids])
        for run_id, k in zip(ids, rng.permutation(counts), strict=True):
            rows = np.flatnonzero(runs == run_id)
            late = rows[np.argsort(steps[rows], kind="stable")][len(rows) - min(k, len(rows)) :]
            out[late] = 1
    return out


def separability(
    X: pd.DataFrame, y: np.ndarray, group: np.ndarray, *, min_rows: int = MIN_ROWS
) -> pd.DataFrame:
    """Per group and signal group, the best single feature's direction-free ROC-AUC.

    ``X``: feature rows, ``y``: their 0/1 targets, ``group``: each row's set-up group
    (e.g. its run's optimizer). A feature counts in a group where it has at least
    ``min_rows`` finite rows holding both targets.

    Returns one row per (group, signal group), sorted: ``group``, ``family`` (the signal
    group; the column keeps its old name for one release), ``auc`` (of the best
    feature), ``feature`` (which), ``rows`` and ``positives`` (the group's).
    """
    y, group = np.asarray(y), np.asarray(group)
    if not (len(X) == len(y) == len(group)):
        raise ValueError(
            f"X, y and group must have one entry per row; got {len(X)}, {len(y)} and {len(group)}"
        )
    group_of, every = signal_groups(), X.to_numpy(dtype=np.float64)
    rows = []
    for g in sorted(set(group.tolist())):
        member = group == g
        target, values = y[member], every[member]
        best: dict[str, tuple[float, str]] = {}
        for j, name in enumerate(X.columns):
            finite = np.isfinite(values[:, j])
            if finite.sum() < min_rows or np.unique(target[finite]).size < 2:
                continue
            auc = roc_auc_score(target[finite], values[finite, j])
            auc = max(auc, 1.0 - auc)
            signal_group = feature_group(name, group_of)
            if auc > best.get(signal_group, (-1.0, ""))[0]:
                best[signal_group] = (auc, name)
        for signal_group, (auc, name) in best.items():
            rows.append((g, signal_group, auc, name, int(member.sum()), int(target.sum())))
    columns = ["group", "signal_group", "auc", "feature", "rows", "positives"]
    return pd.DataFrame(rows, columns=columns).sort_values(
        ["group", "signal_group"], ignore_index=True
    )
