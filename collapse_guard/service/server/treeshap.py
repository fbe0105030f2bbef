"""LightGBM's TreeSHAP contributions from per-leaf tables: the same numbers, far cheaper.

``booster.predict(X, pred_contrib=True)`` walks every tree of every row with the
path-dependent TreeSHAP recursion: ~0.45 ms a row for the bundled model (92 trees of 15
leaves), as much as the rest of scoring a window (loaded 2-core machine, 2026-11-30).
What a leaf adds to a feature's contribution depends on the row only through which of
the leaf's path conditions the row satisfies, one bit per distinct feature on the path
(Yang, "Fast TreeSHAP", 2021, v2). So each leaf's contributions are computed once, at
load, for every pattern of those bits: 1.7 million numbers (13 MB) for the bundled model,
built in ~0.2 s of CPU. Scoring a row is then

- one comparison per split, kept as one int64 word per tree and row (bit ``i``: the row
  goes left at the tree's split ``i``; so at most 64 splits a tree);
- per leaf, its pattern: for each of its ``k`` path features one AND and compare of that
  word (``word & mask == want``: every condition on that feature met);
- one look-up per (leaf, feature) in the leaf's table, its ``k`` entries side by side.

The look-ups are cache misses (13 MB of tables), and what makes them cheap is overlapping
them. Two compiled kernels, by batch size: a batch goes leaf by leaf, the rows in
vectorised inner loops (the rows' look-ups are independent, and the next leaf's entries
are prefetched while this leaf's are summed); up to 3 rows go row by row, in flat loops
over every slot and leaf (a loop per leaf, of 1 to 14 slots, mispredicts its exit),
each leaf's entries prefetched before any is summed. Both add every (row, feature)'s
leaf shares in leaf order, as the kernel before them did (it tested each path condition
on a (rows x splits) bool array, leaf by leaf): the same sums, bit for bit (one kernel
against the other is tested; against the old one, checked when this one replaced it).

Measured (bundled model, CPU, best of 7 rounds, 6 runs, 2-core machine at load average
4.0-4.3, 2026-11-30; rows of 64 benchmark windows, and normal rows): 64 rows,
``pred_contrib`` 21-29 ms, the kernel before 6.2-9.3 ms, these 0.53-1.14 ms; one row,
0.36-0.60, 0.06-0.10 and 0.038-0.064 ms (the same row every call), or 0.11-0.20 ms before
and 0.042-0.078 ms now when each call takes the next of 64 rows (other table lines).
Computing each leaf's share on the fly instead (no tables: the product of the k factors,
each divided back out as LightGBM's ``UnwindPath`` does) took 14-17 ms and 0.23-0.29 ms.

For a leaf of value ``v`` whose path holds ``k`` distinct features, with ``z_i`` the
share of the training rows that follow the path at feature ``i`` (product of its cover
ratios) and ``o_i`` whether the row follows it (1) or not (0), path-dependent TreeSHAP
gives feature ``j``::

    phi_j = v * (o_j - z_j) * sum_s  s! (k-1-s)! / k!  *  [t^s] prod_{i != j} (z_i + o_i t)

The sum of these over leaves and trees is ``pred_contrib`` without its last column (the
expected value), up to rounding: the summation order differs (tests pin the agreement
to 1e-9 relative). Split decisions follow LightGBM's ``NumericalDecision`` (NaN and zero
as missing values, values within 1e-35 of zero read as zero).

A model these tables cannot hold (categorical splits, a tree of more than 64 splits, or
a leaf more than ``MAX_PATH_FEATURES`` distinct features deep), or whose tables do not give
``pred_contrib``'s numbers on a seeded check batch (linear trees, say), gets None from
:func:`build`: the caller uses ``pred_contrib`` instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["MAX_PATH_FEATURES", "LeafTables", "build"]

# 2**k patterns x k values per leaf: 14 is 230,000 numbers for one leaf, the most worth
# holding; the bundled model's deepest leaf has 12
MAX_PATH_FEATURES = 14
# LightGBM's kZeroThreshold, a C float (1e-35f = 1.0000000180025095e-35): magnitudes up to
# it are read as 0; its splits around zero sit exactly there
_ZERO = float(np.float32(1e-35))
# a row's split decisions in one tree are one int64 word: a tree of more splits (over 65
# leaves) is not held
_WORD_BITS = 64


@dataclass(frozen=True)
class LeafTables:
    """Every split, every leaf's path and the contribution tables of one booster.

    Built by :func:`build`; the arrays are what the compiled kernels read.
    """

    n_features: int
    # splits (internal nodes), tree by tree: bit ``s - tree_starts[t]`` of a row's word for
    # tree t is whether it goes left at split s
    split_feature: np.ndarray  # int64, feature column of each split
    threshold: np.ndarray  # float64: the row goes left when value <= threshold
    nan_left: np.ndarray  # bool: where NaN goes
    zero_left: np.ndarray  # bool: where 0 (any magnitude up to 1e-35) goes
    tree_starts: np.ndarray  # int64, first split of each tree, then the end
    # each leaf's distinct path features ("slots"), leaf by leaf
    slot_feature: np.ndarray  # int64, feature of each slot
    slot_mask: np.ndarray  # int64, the bits of its tree's word its conditions test
    slot_want: np.ndarray  # int64, the values there that follow the path
    slot_tree: np.ndarray  # int64, its leaf's tree
    slot_bit: np.ndarray  # int64, its place in its leaf (its bit of the leaf's pattern)
    slot_leaf: np.ndarray  # int64, its leaf
    leaf_starts: np.ndarray  # int64, first slot of each leaf, then the end
    leaf_base: np.ndarray  # int64, where the leaf's (2**k, k) table starts, less its first slot
    table: np.ndarray  # float64, every leaf's table, flat

    def contributions(self, X: np.ndarray) -> np.ndarray:
        """``(n, n_features)`` TreeSHAP contributions of rows ``X`` (raw log-odds)."""
        # features x rows: the batch kernel's inner loops run along rows, contiguous
        XT = np.ascontiguousarray(np.asarray(X, dtype=np.float64).T)
        out = np.zeros((self.n_features, XT.shape[1]))
        _contributions(
            XT,
            self.split_feature,
            self.threshold,
            self.nan_left,
            self.zero_left,
            self.tree_starts,
            self.slot_feature,
            self.slot_mask,
            self.slot_want,
            self.slot_tree,
            self.slot_bit,
            self.slot_leaf,
            self.leaf_starts,
            self.leaf_base,
            self.table,
            out,
        )
        return np.ascontiguousarray(out.T)


# rows from which the batch kernel (leaf by leaf) beats the row kernel (row by row), CPU
# ms, loaded 2-core machine: 1 row 0.08-0.10 vs 0.04, 2 rows 0.11-0.12 vs 0.08-0.09,
# 3 rows 0.13-0.14 vs 0.12, 4 rows 0.14-0.18 vs 0.17-0.23, 8 rows 0.18-0.22 vs 0.32-0.44
_BATCH_ROWS = 4


# compiled once and cached next to this file, as the feature kernel (features/stats.py)
@numba.njit(cache=True)
def _contributions(
    XT, split_feature, threshold, nan_left, zero_left, tree_starts, slot_feature, slot_mask,
    slot_want, slot_tree, slot_bit, slot_leaf, leaf_starts, leaf_base, table, out,
):  # fmt: skip
    """Add rows ``XT`` (features x rows)' contributions to ``out`` (features x rows).

    Every (row, feature) gets its leaves' shares in leaf order, whichever kernel runs:
    the same sums, bit for bit."""
    splits = (split_feature, threshold, nan_left, zero_left, tree_starts)
    if XT.shape[1] >= _BATCH_ROWS:
        words = _words(XT, *splits)
        _batch(
            words, slot_feature, slot_mask, slot_want, slot_tree, leaf_starts, leaf_base, table, out
        )
    else:
        _rows(
            XT, splits, slot_feature, slot_mask, slot_want, slot_tree, slot_bit, slot_leaf,
            leaf_starts, leaf_base, table, out,
        )  # fmt: skip


@intrinsic
def _prefetch(typingctx, array, index):
    """Start fetching ``array[index]``'s cache line, waiting for nothing (LLVM's
    ``prefetch``: read, keep in every cache level)."""

    def codegen(context, builder, signature, args):
        data = context.make_array(array)(context, builder, args[0])
        at = cgutils.get_item_pointer(context, builder, array, data, [args[1]])
        byte, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        kind = ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32])
        fetch = cgutils.get_or_insert_function(builder.module, kind, "llvm.prefetch.p0")
        builder.call(fetch, [builder.bitcast(at, byte), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen


@numba.njit(cache=True, inline="always")
def _left(x, threshold, nan_left, zero_left):
    """Whether value ``x`` goes left (LightGBM's ``NumericalDecision``)."""
    if np.isnan(x):
        return nan_left
    if abs(x) <= _ZERO:
        return zero_left
    return x <= threshold


@numba.njit(cache=True)
def _words(XT, split_feature, threshold, nan_left, zero_left, tree_starts):
    """``(trees, rows)`` int64: bit ``i`` set where the row goes left at the tree's split
    ``i``; split by split, the rows in the inner loop (vectorised)."""
    words = np.zeros((len(tree_starts) - 1, XT.shape[1]), dtype=np.int64)
    for tree in range(len(tree_starts) - 1):
        for s in range(tree_starts[tree], tree_starts[tree + 1]):
            x_s, bit = XT[split_feature[s]], s - tree_starts[tree]
            t, nan, zero = threshold[s], nan_left[s], zero_left[s]
            for r in range(len(x_s)):
                words[tree, r] |= np.int64(_left(x_s[r], t, nan, zero)) << bit
    return words


@numba.njit(cache=True)
def _batch(
    words, slot_feature, slot_mask, slot_want, slot_tree, leaf_starts, leaf_base, table, out
):
    """Leaf by leaf, every row in the inner loops (vectorised; the leaf's table lines stay
    in cache for the batch, and the rows' look-ups are independent: the misses overlap).
    The next leaf's entries are prefetched while this leaf's are summed."""
    where = np.empty((2, words.shape[1]), dtype=np.int64)  # this leaf's, the next one's
    for leaf in range(len(leaf_starts) - 1):
        if leaf == 0:
            _where(words, slot_mask, slot_want, slot_tree, leaf_starts, leaf_base, 0, where[0])
        if leaf + 2 < len(leaf_starts):
            ahead = where[(leaf + 1) % 2]
            _where(words, slot_mask, slot_want, slot_tree, leaf_starts, leaf_base, leaf + 1, ahead)
            for r in range(len(ahead)):
                _prefetch(table, ahead[r] + leaf_starts[leaf + 1])
        at = where[leaf % 2]
        for slot in range(leaf_starts[leaf], leaf_starts[leaf + 1]):
            feature = out[slot_feature[slot]]
            for r in range(len(at)):
                feature[r] += table[at[r] + slot]


@numba.njit(cache=True, inline="always")
def _where(words, slot_mask, slot_want, slot_tree, leaf_starts, leaf_base, leaf, where):
    """Where each row's entries of ``leaf`` start in ``table`` (less the first slot)."""
    first, end = leaf_starts[leaf], leaf_starts[leaf + 1]
    word = words[slot_tree[first]]
    where[:] = 0
    for slot in range(first, end):
        mask, want, bit = slot_mask[slot], slot_want[slot], slot - first
        for r in range(len(where)):
            where[r] |= np.int64((word[r] & mask) == want) << bit
    for r in range(len(where)):
        where[r] = leaf_base[leaf] + where[r] * (end - first)


@numba.njit(cache=True)
def _rows(
    XT, splits, slot_feature, slot_mask, slot_want, slot_tree, slot_bit, slot_leaf,
    leaf_starts, leaf_base, table, out,
):  # fmt: skip
    """Row by row, each loop flat over every split, slot or leaf: a loop per leaf, of 1
    to 14 slots, mispredicts its exit (the batch kernel on one row: ~2x the time)."""
    split_feature, threshold, nan_left, zero_left, tree_starts = splits
    word = np.empty(len(tree_starts) - 1, dtype=np.int64)
    # running sum of the slots' pattern bits: a leaf's pattern is its rise over the leaf
    met = np.empty(len(slot_feature) + 1, dtype=np.int64)
    met[0] = 0  # the rest is written for every row
    where = np.empty(len(leaf_starts) - 1, dtype=np.int64)
    for r in range(XT.shape[1]):
        for tree in range(len(word)):
            bits = 0
            for s in range(tree_starts[tree], tree_starts[tree + 1]):
                left = _left(XT[split_feature[s], r], threshold[s], nan_left[s], zero_left[s])
                bits |= np.int64(left) << (s - tree_starts[tree])
            word[tree] = bits
        total = 0
        for slot in range(len(slot_feature)):
            test = word[slot_tree[slot]] & slot_mask[slot]
            total += np.int64(test == slot_want[slot]) << slot_bit[slot]
            met[slot + 1] = total
        for leaf in range(len(where)):
            first, end = leaf_starts[leaf], leaf_starts[leaf + 1]
            where[leaf] = leaf_base[leaf] + (met[end] - met[first]) * (end - first)
            # the leaf's entries (one or two cache lines): the misses overlap, where the
            # loop below, whose sums wait on them, would take them nearly one at a time
            _prefetch(table, where[leaf] + first)
            _prefetch(table, where[leaf] + end - 1)
        for slot in range(len(slot_feature)):
            out[slot_feature[slot], r] += table[where[slot_leaf[slot]] + slot]


def build(booster: Any) -> LeafTables | None:
    """The tables of a LightGBM booster, or None when they cannot stand in for its
    ``pred_contrib`` (a split they cannot hold, or different numbers on the check)."""
    dump = booster.dump_model()  # the trees predict() uses (best iteration, if any)
    splits: list[dict[str, Any]] = []
    leaves: list[tuple[float, list[tuple[int, bool]]]] = []  # value, (split, left) path
    tree_starts = [0]
    for tree in dump["tree_info"]:
        if not _collect(tree["tree_structure"], [], splits, leaves):
            return None
        if len(splits) - tree_starts[-1] > _WORD_BITS:
            return None
        tree_starts.append(len(splits))
    paths = [_slots(path, splits) for _, path in leaves]
    if any(len(slots) > MAX_PATH_FEATURES for slots in paths):
        return None
    tables = _assemble(len(dump["feature_names"]), splits, tree_starts, leaves, paths)
    return tables if _agrees(tables, booster) else None


def _agrees(tables: LeafTables, booster: Any, rows: int = 32) -> bool:
    """Whether the tables give ``pred_contrib``'s numbers on rows that sit on, just
    beside and off the split thresholds, zeros and NaN included (seeded)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(rows, tables.n_features))
    n_splits = len(tables.threshold)
    if n_splits:  # none in a booster of one-leaf trees
        picked = rng.integers(0, n_splits, size=(rows, 4 * n_splits // rows + 1))
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
    tree_starts: list[int],
    leaves: list[tuple[float, list[tuple[int, bool]]]],
    paths: list[list[tuple[int, list[tuple[int, bool]], float]]],
) -> LeafTables:
    """Flat arrays of the splits, the slots and every leaf's table."""
    ks = np.array([len(slots) for slots in paths], dtype=np.int64)
    leaf_starts = np.concatenate([[0], np.cumsum(ks)]).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum((1 << ks) * ks)]).astype(np.int64)
    table = np.empty(int(offsets[-1]))
    _fill_tables(
        np.array([value for value, _ in leaves], dtype=np.float64),
        np.array([share for slots in paths for _, _, share in slots], dtype=np.float64),
        leaf_starts,
        offsets,
        _shapley_weights(int(ks.max(initial=1))),
        table,
    )
    threshold = np.array([s["threshold"] for s in splits], dtype=np.float64)
    default_left = np.array([s["default_left"] for s in splits], dtype=bool)
    missing = np.array([s["missing"] for s in splits], dtype=object)
    # NaN that is not the missing value is read as 0; 0 goes where 0 <= threshold sends
    # it unless it is the missing value (LightGBM's NumericalDecision)
    zero_left = np.where(missing == "Zero", default_left, 0.0 <= threshold)
    leaf_of = np.repeat(np.arange(len(paths)), ks)
    return LeafTables(
        n_features=n_features,
        split_feature=np.array([s["feature"] for s in splits], dtype=np.int64),
        threshold=threshold,
        nan_left=np.where(missing == "NaN", default_left, zero_left),
        zero_left=zero_left,
        tree_starts=np.array(tree_starts, dtype=np.int64),
        **_slot_tests(paths, tree_starts),
        slot_bit=np.arange(len(leaf_of)) - leaf_starts[leaf_of],
        slot_leaf=leaf_of,
        leaf_starts=leaf_starts,
        leaf_base=offsets[:-1] - leaf_starts[:-1],
        table=table,
    )


def _slot_tests(
    paths: list[list[tuple[int, list[tuple[int, bool]], float]]], tree_starts: list[int]
) -> dict[str, np.ndarray]:
    """Each slot's feature, tree, and the (mask, want) bits of its tree's word that say
    whether a row meets its conditions: ``word & mask == want``."""
    feature, tree, mask, want = [], [], [], []
    for slots in paths:
        at = int(np.searchsorted(tree_starts, slots[0][1][0][0], side="right")) - 1
        for f, conds, _ in slots:
            bits = [(1 << (split - tree_starts[at]), left) for split, left in conds]
            feature.append(f)
            tree.append(at)
            mask.append(sum(bit for bit, _ in bits))
            want.append(sum(bit for bit, left in bits if left))
    # 64-bit masks: bit 63 is the sign bit of the kernel's int64 words
    as_int64 = lambda v: np.array(v, dtype=np.uint64).view(np.int64)  # noqa: E731
    return {
        "slot_feature": np.array(feature, dtype=np.int64),
        "slot_mask": as_int64(mask),
        "slot_want": as_int64(want),
        "slot_tree": np.array(tree, dtype=np.int64),
    }


def _shapley_weights(k_max: int) -> np.ndarray:
    """``w[k, s] = s! (k-1-s)! / k!``: the weight of a coalition of ``s`` of the ``k - 1``
    other features."""
    w = np.zeros((k_max + 1, k_max))
    for k in range(1, k_max + 1):
        for s in range(k):
            w[k, s] = math.factorial(s) * math.factorial(k - 1 - s) / math.factorial(k)
    return w


@numba.njit(cache=True)
def _fill_tables(values, z, leaf_starts, offsets, weights, table):  # fmt: skip
    """Leaf ``l``'s ``(2**k, k)`` table at ``offsets[l]``: entry ``(p, j)`` is what it
    adds to feature ``j``'s contribution when the row follows its path at feature ``i``
    exactly where bit ``i`` of ``p`` is set. ``z[leaf_starts[l]:leaf_starts[l+1]]``:
    its path features' shares."""
    for leaf in range(len(values)):
        zs = z[leaf_starts[leaf] : leaf_starts[leaf + 1]]
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
