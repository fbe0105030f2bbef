"""LightGBM's TreeSHAP contributions from per-leaf tables: the same numbers, ~4x cheaper.

``booster.predict(X, pred_contrib=True)`` walks every tree of every row with the
path-dependent TreeSHAP recursion: ~0.45 ms a row for the bundled model (92 trees of 15
leaves), as much as the rest of scoring a window (loaded 2-core machine, 2026-11-30).
What a leaf adds to a feature's contribution depends on the row only through which of
the leaf's path conditions the row satisfies, one bit per distinct feature on the path
(Yang, "Fast TreeSHAP", 2021, v2). So each leaf's contributions are computed once, at
load, for every pattern of those bits; scoring a row is then one comparison per split,
one pattern per leaf and one table look-up per (leaf, feature), in one compiled loop
that takes the batch leaf by leaf (a leaf's table stays in cache for every row). The
bundled model's tables hold 1.7 million numbers (13 MB), built in ~0.6 s at load.
Measured on 64 windows, loaded 2-core machine, CPU: ``pred_contrib`` 22-30 ms, the
tables 6-8 ms; for one window 0.55-0.7 and 0.07-0.14 ms. Computing each leaf's share
on the fly instead (no tables: the product of the k factors, each divided back out as
LightGBM's ``UnwindPath`` does) took 14-17 ms and 0.23-0.29 ms.

For a leaf of value ``v`` whose path holds ``k`` distinct features, with ``z_i`` the
share of the training rows that follow the path at feature ``i`` (product of its cover
ratios) and ``o_i`` whether the row follows it (1) or not (0), path-dependent TreeSHAP
gives feature ``j``::

    phi_j = v * (o_j - z_j) * sum_s  s! (k-1-s)! / k!  *  [t^s] prod_{i != j} (z_i + o_i t)

The sum of these over leaves and trees is ``pred_contrib`` without its last column (the
expected value), up to rounding: the summation order differs (tests pin the agreement
to 1e-9 relative). Split decisions follow LightGBM's ``NumericalDecision`` (NaN and zero
as missing values, values within 1e-35 of zero read as zero).

A model these tables cannot hold (categorical splits, or a leaf more than
``MAX_PATH_FEATURES`` distinct features deep), or whose tables do not give
``pred_contrib``'s numbers on a seeded check batch (linear trees, say), gets None from
:func:`build`: the caller uses ``pred_contrib`` instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

__all__ = ["MAX_PATH_FEATURES", "LeafTables", "build"]

# 2**k patterns x k values per leaf: 14 is 230,000 numbers for one leaf, the most worth
# holding; the bundled model's deepest leaf has 12
MAX_PATH_FEATURES = 14
# LightGBM's kZeroThreshold, a C float (1e-35f = 1.0000000180025095e-35): magnitudes up to
# it are read as 0; its splits around zero sit exactly there
_ZERO = float(np.float32(1e-35))


@dataclass(frozen=True)
class LeafTables:
    """Every split, every leaf's path and the contribution tables of one booster.

    Built by :func:`build`; the arrays are what the compiled kernel reads.
    """

    n_features: int
    # splits (internal nodes of every tree)
    split_feature: np.ndarray  # int64, feature column of each split
    threshold: np.ndarray  # float64: the row goes left when value <= threshold
    default_left: np.ndarray  # bool: where a missing value goes
    nan_missing: np.ndarray  # bool: NaN is the missing value (else NaN reads as 0)
    zero_missing: np.ndarray  # bool: 0 is the missing value
    # each leaf's path conditions, grouped by distinct feature ("slot"); slots by leaf
    cond_split: np.ndarray  # int64, the split of each condition
    cond_left: np.ndarray  # bool, whether the path goes left there
    slot_starts: np.ndarray  # int64, first condition of each slot, then the end
    slot_feature: np.ndarray  # int64, feature of each slot
    leaf_starts: np.ndarray  # int64, first slot of each leaf, then the end
    leaf_offset: np.ndarray  # int64, where the leaf's (2**k, k) table starts
    table: np.ndarray  # float64, every leaf's table, flat

    def contributions(self, X: np.ndarray) -> np.ndarray:
        """``(n, n_features)`` TreeSHAP contributions of rows ``X`` (raw log-odds)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        out = np.zeros((X.shape[0], self.n_features))
        _contributions(
            X,
            self.split_feature,
            self.threshold,
            self.default_left,
            self.nan_missing,
            self.zero_missing,
            self.cond_split,
            self.cond_left,
            self.slot_starts,
            self.slot_feature,
            self.leaf_starts,
            self.leaf_offset,
            self.table,
            out,
        )
        return out


# compiled once and cached next to this file, as the feature kernel (features/stats.py)
@numba.njit(cache=True)
def _contributions(
    X, split_feature, threshold, default_left, nan_missing, zero_missing,
    cond_split, cond_left, slot_starts, slot_feature, leaf_starts, leaf_offset, table, out,
):  # fmt: skip
    n = X.shape[0]
    left = np.empty((n, len(threshold)), dtype=np.bool_)
    for r in range(n):
        for s in range(len(threshold)):  # LightGBM's NumericalDecision
            x = X[r, split_feature[s]]
            if abs(x) <= _ZERO:
                x = 0.0
            if np.isnan(x) and not nan_missing[s]:
                x = 0.0  # NaN that is not the missing value is read as 0
            if (np.isnan(x) and nan_missing[s]) or (x == 0.0 and zero_missing[s]):
                left[r, s] = default_left[s]
            else:
                left[r, s] = x <= threshold[s]
    # leaf by leaf, every row: a leaf's table stays in cache for the whole batch (row by
    # row, each leaf was a cache miss: ~0.1 ms a row)
    for leaf in range(len(leaf_starts) - 1):
        first, end = leaf_starts[leaf], leaf_starts[leaf + 1]
        for r in range(n):
            pattern = 0  # bit i: the row meets every condition on the leaf's i-th feature
            for slot in range(first, end):
                met = True
                for c in range(slot_starts[slot], slot_starts[slot + 1]):
                    if left[r, cond_split[c]] != cond_left[c]:
                        met = False
                        break
                if met:
                    pattern |= 1 << (slot - first)
            base = leaf_offset[leaf] + pattern * (end - first)
            for slot in range(first, end):
                out[r, slot_feature[slot]] += table[base + slot - first]


def build(booster: Any) -> LeafTables | None:
    """The tables of a LightGBM booster, or None when they cannot stand in for its
    ``pred_contrib`` (a split they cannot hold, or different numbers on the check)."""
    dump = booster.dump_model()  # the trees predict() uses (best iteration, if any)
    splits: list[dict[str, Any]] = []
    leaves: list[tuple[float, list[tuple[int, bool]]]] = []  # value, (split, left) path
    for tree in dump["tree_info"]:
        if not _collect(tree["tree_structure"], [], splits, leaves):
            return None
    paths = [_slots(path, splits) for _, path in leaves]
    if any(len(slots) > MAX_PATH_FEATURES for slots in paths):
        return None
    tables = _assemble(len(dump["feature_names"]), splits, leaves, paths)
    return tables if _agrees(tables, booster) else None


def _agrees(tables: LeafTables, booster: Any, rows: int = 32) -> bool:
    """Whether the tables give ``pred_contrib``'s numbers on rows that sit on, just
    beside and off the split thresholds, zeros and NaN included (seeded)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(rows, tables.n_features))
    picked = rng.integers(
        0, len(tables.threshold), size=(rows, 4 * len(tables.threshold) // rows + 1)
    )
    for r, splits in enumerate(picked):
        nudge = rng.choice([-1.0, 0.0, 1.0], size=len(splits))
        X[r, tables.split_feature[splits]] = tables.threshold[splits] + nudge * 1e-9
    X[rng.random(X.shape) < 0.1] = np.nan
    X[rng.random(X.shape) < 0.05] = 0.0
    expected = booster.predict(X, pred_contrib=True, num_threads=1)[:, :-1]
    return bool(np.allclose(tables.contributions(X), expected, rtol=1e-9, atol=1e-12))


def _collect(
    node: dict[str, Any],
    path: list[tuple[int, bool]],
    splits: list[dict[str, Any]],
    leaves: list[tuple[float, list[tuple[int, bool]]]],
) -> bool:
    """Splits and leaves of one tree, depth first; False if a split is not numerical."""
    if "leaf_value" in node:
        if path:  # a one-leaf tree adds to the expected value only
            leaves.append((float(node["leaf_value"]), path))
        return True
    if node.get("decision_type") != "<=":
        return False
    index = len(splits)
    count = float(node["internal_count"])
    splits.append(
        {
            "feature": int(node["split_feature"]),
            "threshold": float(node["threshold"]),
            "default_left": bool(node["default_left"]),
            "missing": node["missing_type"],
            # cover ratios: the share of this node's training rows in each child
            "left_share": _count(node["left_child"]) / count,
            "right_share": _count(node["right_child"]) / count,
        }
    )
    return _collect(node["left_child"], [*path, (index, True)], splits, leaves) and _collect(
        node["right_child"], [*path, (index, False)], splits, leaves
    )


def _count(node: dict[str, Any]) -> float:
    return float(node["leaf_count"] if "leaf_value" in node else node["internal_count"])


def _slots(
    path: list[tuple[int, bool]], splits: list[dict[str, Any]]
) -> list[tuple[int, list[tuple[int, bool]], float]]:
    """A leaf's distinct features in path order: (feature, its conditions, its z)."""
    slots: dict[int, tuple[list[tuple[int, bool]], list[float]]] = {}
    for split, left in path:
        conditions, shares = slots.setdefault(splits[split]["feature"], ([], []))
        conditions.append((split, left))
        shares.append(splits[split]["left_share" if left else "right_share"])
    return [(f, conds, math.prod(shares)) for f, (conds, shares) in slots.items()]


def _assemble(
    n_features: int,
    splits: list[dict[str, Any]],
    leaves: list[tuple[float, list[tuple[int, bool]]]],
    paths: list[list[tuple[int, list[tuple[int, bool]], float]]],
) -> LeafTables:
    """Flat arrays of the splits, the slots and every leaf's table."""
    conditions: list[tuple[int, bool]] = []
    slot_starts, slot_feature, leaf_starts = [], [], []
    for slots in paths:
        leaf_starts.append(len(slot_feature))
        for feature, conds, _ in slots:
            slot_starts.append(len(conditions))
            slot_feature.append(feature)
            conditions.extend(conds)
    ks = np.array([len(slots) for slots in paths], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum((1 << ks) * ks)]).astype(np.int64)
    table = np.empty(int(offsets[-1]))
    _fill_tables(
        np.array([value for value, _ in leaves], dtype=np.float64),
        np.array([share for slots in paths for _, _, share in slots], dtype=np.float64),
        np.concatenate([[0], np.cumsum(ks)]).astype(np.int64),
        offsets,
        _shapley_weights(int(ks.max(initial=1))),
        table,
    )
    missing = [split["missing"] for split in splits]
    return LeafTables(
        n_features=n_features,
        split_feature=np.array([s["feature"] for s in splits], dtype=np.int64),
        threshold=np.array([s["threshold"] for s in splits], dtype=np.float64),
        default_left=np.array([s["default_left"] for s in splits], dtype=bool),
        nan_missing=np.array([m == "NaN" for m in missing], dtype=bool),
        zero_missing=np.array([m == "Zero" for m in missing], dtype=bool),
        cond_split=np.array([c for c, _ in conditions], dtype=np.int64),
        cond_left=np.array([left for _, left in conditions], dtype=bool),
        slot_starts=np.array([*slot_starts, len(conditions)], dtype=np.int64),
        slot_feature=np.array(slot_feature, dtype=np.int64),
        leaf_starts=np.array([*leaf_starts, len(slot_feature)], dtype=np.int64),
        leaf_offset=offsets[:-1],
        table=table,
    )


def _shapley_weights(k_max: int) -> np.ndarray:
    """``w[k, s] = s! (k-1-s)! / k!``: the weight of a coalition of ``s`` of the ``k - 1``
    other features."""
    w = np.zeros((k_max + 1, k_max))
    for k in range(1, k_max + 1):
        for s in range(k):
            w[k, s] = math.factorial(s) * math.factorial(k - 1 - s) / math.factorial(k)
    return w


@numba.njit(cache=True)
def _fill_tables(values, z, slot_starts, offsets, weights, table):  # fmt: skip
    """Leaf ``l``'s ``(2**k, k)`` table at ``offsets[l]``: entry ``(p, j)`` is what it
    adds to feature ``j``'s contribution when the row follows its path at feature ``i``
    exactly where bit ``i`` of ``p`` is set. ``z[slot_starts[l]:slot_starts[l+1]]``:
    its path features' shares."""
    for leaf in range(len(values)):
        zs = z[slot_starts[leaf] : slot_starts[leaf + 1]]
        k = len(zs)
        full = np.empty(k + 1)
        rest = np.empty(k)
        for pattern in range(1 << k):
            # coefficients of prod_i (z_i + o_i t)
            full[:] = 0.0
            full[0] = 1.0
            for i in range(k):
                o = (pattern >> i) & 1
                for s in range(i + 1, 0, -1):
                    full[s] = full[s] * zs[i] + full[s - 1] * o
                full[0] *= zs[i]
            for j in range(k):
                o = (pattern >> j) & 1
                # prod_{i != j}: divide (z_j + o_j t) back out (as LightGBM's UnwindPath)
                if o:
                    rest[k - 1] = full[k]
                    for s in range(k - 1, 0, -1):
                        rest[s - 1] = full[s] - zs[j] * rest[s]
                else:
                    for s in range(k):
                        rest[s] = full[s] / zs[j]
                total = 0.0
                for s in range(k):
                    total += weights[k, s] * rest[s]
                table[offsets[leaf] + pattern * k + j] = values[leaf] * (o - zs[j]) * total
