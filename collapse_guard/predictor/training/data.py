"""Run files -> training rows, and run-level splits that never leak a run.

Rows: the feature vector at every ``stride``-th step of a run (the window ending at
that step), with target y = 1 when the run's onset lies in (step, step + horizon]
(``runfiles.label.collapse_targets``). Rows at or after onset are dropped: once a
run has collapsed there is nothing left to forecast. So are the last ``horizon`` steps
before a *sudden* onset (``extra["onset_kind"]``: less than 10 steps after its trigger):
nothing in them foretells it, and as positives they teach the model that healthy-looking
windows collapse (leave-one-family-out, recall rose without them: benchmarks/README.md,
"Predictor: honest evaluation"). Evaluation still counts every sudden collapse: the
model's probability is that of a collapse that develops, and the sudden ones are missed
in the figures, not hidden.
``groups`` is the run id of each row and ``source`` its data source, so every later step
can split, weight or report by run and by source; ``in_rise`` whether the row's step lies
in an LR rise of its run (``features.rises``, the evaluation's definition), so that the fit
can weigh the healthy rows there (:func:`healthy_rise_weights`).

Why stride 10 by default: neighbouring windows share 199 of 200 steps, so dense rows
add almost no information but multiply training time; every 10th step keeps ~20
positive rows per collapse (H = 200) and trains on ~1,000 runs in minutes on 2 cores.
Evaluation never uses strided rows: it scores every step (``evaluate``).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from collapse_guard.errors import UserInputError
from collapse_guard.features.rises import rows_in_lr_rise
from collapse_guard.predictor.core.model import DEFAULT_STRIDE
from collapse_guard.runfiles import RunMeta
from collapse_guard.runfiles.label import HORIZON, collapse_targets
from collapse_guard.runfiles.records import RunRecord
from collapse_guard.signals import SIGNALS

__all__ = [
    "DEFAULT_FRACTIONS",
    "HEALTHY_RISE_WEIGHT",
    "MODEL_SIGNALS",
    "POSITIVES_WITHIN",
    "RowCache",
    "RunSplit",
    "TrainingData",
    "build_training_data",
    "concat_rows",
    "healthy_rise_weights",
    "near_positives",
    "require_trainable_split",
    "run_rows",
    "split_runs",
]

DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)  # train, validation, test: shares of the runs

# What a model predicts from: every signal but the machine's telemetry (free host memory,
# GPU power and memory), which tells what else runs on the machine rather than how the
# run trains; a model fed it learns the machines its training runs were made on
# (measured: host_mem_available was among the 20 features with most gain). The probe
# still records it, for forensics. Nor the optimizer-state family, until an ablation inside
# LR rises keeps it (issue 34 item 4: four, with 22 of 334, 47 of 359, 284 of 612 and ~600
# of 925 runs recording it, found no gain; benchmarks/README.md), nor the line group (the
# loss along the step: one, 81 of 925 runs, no gain); the data runs record both.
MODEL_SIGNALS: tuple[str, ...] = tuple(
    s.name for s in SIGNALS if s.group not in ("system", "optimizer", "line")
)

# The positives a collapse trains by default: every row of the horizon (None). The bundled
# model trains on those within 100 steps of the onset (lifecycle.bundle.BUNDLE_POSITIVES_WITHIN):
# on real runs of held-out families that caught more collapses at the same ranking, but on the
# short synthetic runs of the tests a small model trained so ranked the test rows at ROC-AUC 0.42
# (0.67 on every row): the bundled model's choice, not train's (benchmarks/README.md, "warn at
# 1 per 5,000").
POSITIVES_WITHIN: int | None = None

# What a healthy row inside an LR rise weighs in the fit by default: as much as any row. The
# false alarms of healthy runs live in their LR rises (issue 34); weighed 3, on held-out
# families they fell there from 2.27-2.53 to 1.72-2.18 per 10k, the develops caught at warn
# from 52-55 % to 50-53 %, the ranking inside rises unchanged (ROC-AUC 0.67-0.68): a move
# along the same curve, as a tighter budget is; the guard with a model so trained saved 11 of 15
# unseen saveable develops against 13, so the bundled model does not weigh them
# (benchmarks/README.md, "Healthy rises weighed more").
HEALTHY_RISE_WEIGHT = 1.0


@dataclass(frozen=True)
class RunSplit:
    """Run ids of each split (never a row split: a run lives in exactly one)."""

    train: tuple[str, ...]
    validation: tuple[str, ...]
    test: tuple[str, ...]

    def to_dict(self) -> dict[str, list[str]]:
        return {
            "train": list(self.train),
            "validation": list(self.validation),
            "test": list(self.test),
        }

    def of(self, run_id: str) -> str:
        """The split name ("train", "validation" or "test") that holds ``run_id``."""
        for name in ("train", "validation", "test"):
            if run_id in getattr(self, name):
                return name
        raise KeyError(f"run {run_id!r} is in no split")


def _allocate(n: int, fractions: Sequence[float]) -> list[int]:
    # largest-remainder rounding, then every split gets a run when there are enough,
    # so that small strata (e.g. the few imported collapses) reach validation and test
    raw = [n * f for f in fractions]
    counts = [math.floor(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True):
        if sum(counts) == n:
            break
        counts[i] += 1
    if n >= len(fractions):
        for i in range(len(counts)):
            if counts[i] == 0:
                donor = int(np.argmax(counts))
                counts[donor] -= 1
                counts[i] += 1
    return counts


def split_runs(
    metas: Sequence[RunMeta],
    *,
    seed: int = 0,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> RunSplit:
    """Split runs into train/validation/test, stratified by outcome and source.

    Within each (collapsed?, source) stratum the runs are sorted by id, shuffled with
    ``seed`` and dealt out by ``fractions``: the split depends only on the seed and the
    set of runs, not on file order.
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not math.isclose(sum(fractions), 1):
        raise ValueError(
            f"fractions must be three non-negative shares (train, validation, test) summing "
            f"to 1; got {tuple(fractions)}. Fix: e.g. {DEFAULT_FRACTIONS}"
        )
    counts = Counter(m.run_id for m in metas)
    dupes = sorted(r for r, c in counts.items() if c > 1)
    if dupes:
        raise ValueError(
            f"run ids must be unique to split by run; duplicated: {', '.join(dupes[:10])}"
        )
    strata: dict[tuple[bool, str], list[str]] = defaultdict(list)
    for m in metas:
        strata[(m.onset_step is not None, m.source)].append(m.run_id)
    rng = np.random.default_rng(seed)
    parts: list[list[str]] = [[], [], []]
    for key in sorted(strata):
        ids = sorted(strata[key])
        ids = [ids[i] for i in rng.permutation(len(ids))]
        start = 0
        for part, count in zip(parts, _allocate(len(ids), fractions), strict=True):
            part.extend(ids[start : start + count])
            start += count
    return RunSplit(*(tuple(sorted(p)) for p in parts))


# What each split needs to train: the fit a collapse; calibration a collapse and the levels
# a healthy run (validation); the evaluation any run (None: either outcome).
_NEEDED: tuple[tuple[str, str | None], ...] = (
    ("train", "collapsed"),
    ("validation", "collapsed"),
    ("validation", "healthy"),
    ("test", None),
)


def require_trainable_split(metas: Sequence[RunMeta], split: RunSplit) -> None:
    """Raise :class:`UserInputError` naming what each part of ``split`` lacks for a
    training (``_NEEDED``), before any fit: with a part empty the fit, the calibration or
    the levels would fail later with an error that names none of it.
    """
    collapsed = {m.run_id for m in metas if m.onset_step is not None}

    def has(part: str, kind: str | None) -> bool:
        return any(
            kind is None or (i in collapsed) == (kind == "collapsed") for i in getattr(split, part)
        )

    missing = [
        f"no {kind + ' ' if kind else ''}run in {part}"
        for part, kind in _NEEDED
        if not has(part, kind)
    ]
    if missing:
        raise UserInputError(
            f"too few runs to train: {len(metas)} runs ({len(metas) - len(collapsed)} healthy, "
            f"{len(collapsed)} collapsed) split by run into train {len(split.train)}, "
            f"validation {len(split.validation)}, test {len(split.test)} leave "
            + ", ".join(missing),
            "give at least 3 healthy and 3 collapsed runs of a source, e.g. "
            "`collapse-guard data synth --n 20 --out DIR`, then --runs DIR",
        )


@dataclass
class TrainingData:
    """Feature rows with their target, run id (group), data source and step."""

    X: pd.DataFrame
    y: np.ndarray
    groups: np.ndarray
    source: np.ndarray
    steps: np.ndarray
    in_rise: np.ndarray  # bool: the row's step lies in an LR rise of its run

    def __len__(self) -> int:
        return len(self.y)

    def take(self, keep: np.ndarray | slice) -> TrainingData:
        """The rows ``keep`` selects (a boolean mask or a slice), in order."""
        return TrainingData(
            X=self.X.iloc[keep].reset_index(drop=True),
            y=self.y[keep],
            groups=self.groups[keep],
            source=self.source[keep],
            steps=self.steps[keep],
            in_rise=self.in_rise[keep],
        )


def healthy_rise_weights(data: TrainingData, weight: float) -> np.ndarray | None:
    """The fit's row weights: ``weight`` for the healthy rows inside an LR rise, 1 for the
    rest; None (an unweighted fit) when ``weight`` is 1.

    Why: a healthy run's highest risk comes while its LR rises (warm-up's end, a re-warm),
    and there its false alarms live; rows there weighed more, the model pays more for
    calling a rise that the run absorbs a collapse. The calibration, fitted on unweighted
    validation rows, keeps the risk a probability.
    """
    if weight == 1.0:
        return None
    return np.where((data.y == 0) & data.in_rise, float(weight), 1.0)


def near_positives(
    data: TrainingData, runs: Sequence[RunRecord], within: int | None
) -> TrainingData:
    """``data`` without the positive rows more than ``within`` steps before their run's onset.

    Why: a collapse caused by an LR rise is, 100-200 steps ahead, a run in the middle of a
    rise that looks as healthy as it then is; taught as positives, those rows teach "the
    LR is rising" and the risk of every healthy rise goes up with it. Left out (neither
    positive nor healthy), the model learns from the rows where the run's response shows.
    The alarms are still counted 10-200 steps ahead (the horizon). ``None``: all kept.
    """
    if within is None:
        return data
    onsets = {r.run_id: r.meta.onset_step for r in runs if r.meta.onset_step is not None}
    onset = np.array([onsets.get(str(g), -1) for g in data.groups], dtype=np.int64)
    return data.take((data.y == 0) | (onset - data.steps <= within))


def _row_steps(frame: pd.DataFrame, meta: RunMeta, *, stride: int, horizon: int) -> np.ndarray:
    """The steps a run's training rows end at: every ``stride``-th usable step."""
    all_steps = frame["step"].to_numpy()
    _, usable = collapse_targets(all_steps, meta.onset_step, horizon)
    if meta.extra.get("onset_kind") == "sudden":  # datasets.real.onset; module docstring
        usable &= all_steps < meta.onset_step - horizon
    return all_steps[usable][::stride]


class _RowBuffer:
    """Training rows written in place, run by run, into arrays sized beforehand."""

    def __init__(self, n: int, names: Sequence[str]) -> None:
        self.names = list(names)
        # C order, rows x features: the DataFrame wraps it without a copy, and LightGBM
        # reads it as it is
        self.X = np.empty((n, len(self.names)), dtype=np.float64)
        self.y = np.empty(n, dtype=np.int8)
        self.groups = np.empty(n, dtype=object)
        self.source = np.empty(n, dtype=object)
        self.steps = np.empty(n, dtype=np.int64)
        self.in_rise = np.empty(n, dtype=bool)
        self.at = 0

    def add(self, run: RunRecord, frame: pd.DataFrame, extractor, ends, horizon: int) -> None:
        feats = extractor.transform_run(frame, steps=ends)
        ends = feats.index.to_numpy()
        y, _ = collapse_targets(ends, run.meta.onset_step, horizon)
        rows = slice(self.at, self.at + len(ends))
        self.X[rows], self.y[rows], self.steps[rows] = feats.to_numpy(), y, ends
        self.groups[rows], self.source[rows] = run.run_id, run.meta.source
        self.in_rise[rows] = rows_in_lr_rise(self.groups[rows], ends, {run.run_id: frame})
        self.at += len(ends)

    def rows(self) -> TrainingData:
        """The rows written so far (views: the unused tail stays allocated)."""
        n = self.at
        return TrainingData(
            X=pd.DataFrame(self.X[:n], columns=self.names, copy=False),
            y=self.y[:n],
            groups=self.groups[:n],
            source=self.source[:n],
            steps=self.steps[:n],
            in_rise=self.in_rise[:n],
        )


def run_rows(run: RunRecord, extractor, *, stride: int, horizon: int) -> TrainingData | None:
    """One run's training rows (``build_training_data``); None when it has none."""
    frame = run.frame
    steps = _row_steps(frame, run.meta, stride=stride, horizon=horizon)
    if steps.size == 0:
        return None
    out = _RowBuffer(steps.size, extractor.schema.names)
    out.add(run, frame, extractor, steps, horizon)
    return out.rows()


def concat_rows(parts: Sequence[TrainingData], n_runs: int) -> TrainingData:
    """Rows of many runs, in the given order (row order feeds LightGBM's bagging)."""
    if not parts:
        raise ValueError(
            f"no training rows from {n_runs} run(s): every run is empty or starts collapsed; "
            "fix: pass run files with steps before their onset"
        )
    return TrainingData(
        X=pd.concat([p.X for p in parts], ignore_index=True),
        y=np.concatenate([p.y for p in parts]),
        groups=np.concatenate([p.groups for p in parts]),
        source=np.concatenate([p.source for p in parts]),
        steps=np.concatenate([p.steps for p in parts]),
        in_rise=np.concatenate([p.in_rise for p in parts]),
    )


def build_training_data(
    runs: Sequence[RunRecord],
    extractor,
    *,
    stride: int = DEFAULT_STRIDE,
    horizon: int = HORIZON,
    progress: Callable[[], None] | None = None,
) -> TrainingData:
    """Feature rows at every ``stride``-th step before onset of each run.

    ``extractor`` is a ``features.FeatureExtractor``. Rows at and after onset are
    dropped (``collapse_targets``' ``usable``). ``predictor.training.fleet`` computes the same
    rows on Dask workers (``run_rows`` per run, ``concat_rows`` in run order).
    ``progress`` is called once per run whose rows are done (a progress bar's advance).

    Memory: the rows are written straight into one array, so the rows of the whole set
    exist once (a list of per-run frames concatenated held them twice; the peaks are in
    benchmarks/README.md, "training memory"); each run's frame and features exist only
    while its rows are written. The array is sized from the runs' lengths
    (``RunRecord.n_rows``: every stride-th row), an upper bound, so that a run stored
    on disk is read once; the rows after onset are the unused part.
    """
    if stride < 1:
        raise ValueError(f"stride must be >= 1 step; got {stride}")
    out = _RowBuffer(sum(-(-r.n_rows // stride) for r in runs), extractor.schema.names)
    for run in runs:
        frame = run.frame
        ends = _row_steps(frame, run.meta, stride=stride, horizon=horizon)
        if ends.size:
            out.add(run, frame, extractor, ends, horizon)
        if progress is not None:
            progress()
    if not out.at:
        concat_rows([], len(runs))  # the error that says why there are none
    return out.rows()


class RowCache:
    """A row builder (``build_training_data``'s signature) that builds a run's rows once.

    Cross-fitting fits one model per group on the runs without it: each run's rows would be
    extracted again for every fold but its own. Here they are kept by run id, for the
    (schema, stride, horizon) they were built with, and a fold's rows are the kept rows of
    its runs, in its order: the same rows, so the same model. Only the runs not built yet
    go to ``rows`` (``build_training_data``, or the fleet's Dask builder).
    """

    def __init__(self, rows: Callable[..., TrainingData] = build_training_data) -> None:
        self._rows = rows
        self._kept: dict[tuple, dict[str, TrainingData | None]] = {}

    def __call__(
        self,
        runs: Sequence[RunRecord],
        extractor,
        *,
        stride: int = DEFAULT_STRIDE,
        horizon: int = HORIZON,
        progress: Callable[[], None] | None = None,
    ) -> TrainingData:
        kept = self._kept.setdefault((extractor.schema.fingerprint, stride, horizon), {})
        missing = [r for r in runs if r.run_id not in kept]
        if missing:
            built = self._rows(
                missing, extractor, stride=stride, horizon=horizon, progress=progress
            )
            kept.update(_per_run(built, missing))
        if progress is not None:
            for _ in range(len(runs) - len(missing)):
                progress()
        return concat_rows([kept[r.run_id] for r in runs if kept[r.run_id] is not None], len(runs))


def _per_run(data: TrainingData, runs: Sequence[RunRecord]) -> dict[str, TrainingData | None]:
    # a builder writes each run's rows together, in run order: cut where the run id changes
    starts = np.r_[0, np.flatnonzero(data.groups[1:] != data.groups[:-1]) + 1, len(data)]
    out: dict[str, TrainingData | None] = {r.run_id: None for r in runs}  # None: no rows
    for a, b in itertools.pairwise(starts):
        out[str(data.groups[a])] = data.take(slice(a, b))
    return out
