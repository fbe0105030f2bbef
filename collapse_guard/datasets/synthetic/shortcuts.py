"""Does anything separate synthetic collapses from synthetic healthy runs that should not?

Issue 8 ("Synthetic runs without shortcuts"): the bundled model gave ``param_norm`` 31%
of its gain, from a precursor only collapsing synthetic runs carried. A predictor
learns whatever separates its training runs; in synthetic runs that must not be the
generator's own bookkeeping. Two model-free checks, on frames the generator makes
(no files, no model), each a function of the label's onset only:

1. **Precursor rates** (:data:`PRECURSORS`, :func:`precursor_rates`): for each
   precursor the generator gives collapses, the share of collapsing runs whose
   pre-onset steps show it and the share of healthy runs that show it anywhere.
   Detection reads the frame (a window statistic over a threshold), never the spec.
2. **Single-signal separation** (:func:`separation_table`): per signal, two statistics
   of a 200-step window (:func:`window_stats`: drift and curvature, on log10 of
   the signals whose level depends on the model's scale), and the AUROC between the
   collapsing runs' last window before onset and the healthy runs' window at a
   matched position: at a fraction of the run drawn from the collapses' own onset
   fractions (a healthy run has no onset; a fixed position, such as its last 200
   steps, would compare the end of a cosine schedule with mid-run). AUROC is
   folded (max(a, 1 - a)): a signal that falls before collapse separates as well
   as one that rises. A third statistic, ``last_z`` (the z-score of the window's last
   measured value against the window, as the features' ``zscore`` reads it), is
   reported beside them: it sees what happens in the very last steps before onset,
   which block medians smooth away (see :data:`BOUNDED_STATS`).

Run ``python -m collapse_guard.datasets.synthetic.shortcuts --n 400`` for both tables.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from collapse_guard.datasets.synthetic.frame import PARAMETER_SIGNALS
from collapse_guard.datasets.synthetic.generate import synth_run
from collapse_guard.datasets.synthetic.realism import SETTLE_FRAC
from collapse_guard.datasets.synthetic.sampler import SamplerConfig, sample_spec
from collapse_guard.features import DEFAULT_WINDOW

__all__ = [
    "BLOCK",
    "BOUNDED_STATS",
    "EXEMPT",
    "LOG_SIGNALS",
    "PRECURSORS",
    "SIGNALS_READ",
    "WINDOW",
    "Precursor",
    "RunSample",
    "auroc",
    "block_medians",
    "draw_sample",
    "last_z",
    "main",
    "markdown",
    "precursor_rates",
    "separation_table",
    "settled",
    "window_stats",
]

WINDOW = DEFAULT_WINDOW  # what the predictor's features read of a run: its last steps
# Signals whose level depends on the model's size or family (docs/design.md, "Features":
# scale-free): their statistics are taken on log10, so a constant factor drops out.
LOG_SIGNALS: tuple[str, ...] = (
    "param_norm",
    "grad_norm",
    "bottom_grad_norm",
    "attn_logit_max",
    "output_logit_max",
    "update_ratio",
    "loss_scale",
)
# Read but not bounded, each for a reason that holds in real runs too:
EXEMPT: dict[str, str] = {
    "loss": "the label reads it: the window before onset holds the start of the rise "
    "(realism's pre_loss_drift keeps it at the real runs' size)",
    "lr": "a cause, not a measured state: LR jumps and high LR cause real collapses, "
    "and the predictor's config-only baseline measures what the LR alone gives",
}
# Statistics whose AUROC the test bounds. ``last_z`` is reported, not bounded: its
# separation lives in the last few steps before onset, where a precursor ramp peaks (a
# blow-up accelerates into its NaN) or the collapse is already under way while the
# label's smoothed loss has yet to cross its margin; a healthy run's decoy peaks there
# too, but a window at a random place in a healthy run rarely ends on that peak.
BOUNDED_STATS: tuple[str, ...] = ("drift", "curvature")
# Signals the checks read: every model signal with a level that moves (not the system
# telemetry, the curvature that is off by default, or the non-finite counters).
SIGNALS_READ: tuple[str, ...] = (
    "loss",
    "lr",
    "grad_norm",
    "bottom_grad_norm",
    "grad_cv",
    *PARAMETER_SIGNALS,
    "loss_scale",
    "overflow",
    # derived: log10(bottom_grad_norm / grad_norm), the bottom block's share (last)
    "bottom_grad_share",
)


@dataclass(frozen=True)
class RunSample:
    """One run's signals on a dense step grid (log10 for :data:`LOG_SIGNALS`), labelled."""

    kind: str  # the generator's outcome (spec.kind)
    decoys: tuple[str, ...]  # the kinds of a healthy run's decoys (spec.decoys)
    onset: int | None  # the label's onset: the training targets' ground truth
    n_steps: int
    signals: dict[str, np.ndarray]  # name -> values on steps 0 .. n_steps - 1 (NaN = none)


def _dense(frame: pd.DataFrame, n_steps: int) -> dict[str, np.ndarray]:
    steps = frame["step"].to_numpy(np.int64)
    out = {}
    for name in SIGNALS_READ[:-1]:
        column = np.full(n_steps, math.nan)
        column[steps] = frame[name].to_numpy(np.float64)
        if name in LOG_SIGNALS:
            with np.errstate(divide="ignore", invalid="ignore"):
                column = np.where(column > 0, np.log10(np.where(column > 0, column, 1)), np.nan)
        out[name] = np.where(np.isfinite(column), column, np.nan)
    out["bottom_grad_share"] = out["bottom_grad_norm"] - out["grad_norm"]
    return out


def draw_sample(n: int, seed: int = 0, config: SamplerConfig | None = None) -> list[RunSample]:
    """Runs 0 .. n-1 of ``seed``, labelled, as dense arrays (about 15 ms a run)."""
    runs = []
    for index in range(n):
        spec = sample_spec(index, seed, config)
        frame, meta = synth_run(spec)
        decoys = tuple(d.kind for d in spec.decoys)
        signals = _dense(frame, spec.n_steps)
        runs.append(RunSample(spec.kind, decoys, meta.onset_step, spec.n_steps, signals))
    return runs


BLOCK = WINDOW // 4  # a window's quarter: its statistics read the medians of four


def settled(n_steps: int) -> float:
    """First step a window may end at to count: after the warmup transients (the
    loss, gradient-norm and attention drops of the first steps) and a window's length
    in, as realism's statistics skip the first 20% of a run."""
    return max(WINDOW, SETTLE_FRAC * n_steps)


def block_medians(values: np.ndarray, end: int) -> np.ndarray:
    """Medians of the consecutive :data:`BLOCK`-step blocks that end at ``end``, oldest
    first (NaN for a block without a measured value); the first partial block is dropped."""
    count = end // BLOCK
    blocks = values[end - count * BLOCK : end].reshape(count, BLOCK)
    out = np.full(count, math.nan)
    measured = np.isfinite(blocks).any(axis=1)
    out[measured] = np.nanmedian(blocks[measured], axis=1)
    return out


def window_stats(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(drift, curvature)`` of every window of four consecutive blocks, by last block.

    From the medians of a window's quarters q1..q4 (medians: one noisy batch or a
    one-step data spike does not move them): drift = q4 - q1, how far the signal
    moved; curvature = (q4 - q3) - (q2 - q1), whether it moves faster at the end
    than at the start (an accelerating ramp is what a z-score or an EWMA ratio reads).
    Element i is the window whose last block is ``blocks[i + 3]``.
    """
    q1, q2, q3, q4 = blocks[:-3], blocks[1:-2], blocks[2:-1], blocks[3:]
    return q4 - q1, (q4 - q3) - (q2 - q1)


def last_z(values: np.ndarray, end: int) -> float:
    """z-score of the last measured value in the window before ``end`` against the window."""
    window = values[max(end - WINDOW, 0) : end]
    window = window[np.isfinite(window)]
    if window.size < 4 or not window.std() > 0:
        return math.nan
    return float((window[-1] - window.mean()) / window.std())


def auroc(pos: Iterable[float], neg: Iterable[float]) -> float:
    """AUROC of ``pos`` over ``neg`` (NaN dropped; ties count half); NaN if a side is empty."""
    p = np.asarray([v for v in pos if math.isfinite(v)], float)
    q = np.asarray([v for v in neg if math.isfinite(v)], float)
    if p.size == 0 or q.size == 0:
        return math.nan
    return float(roc_auc_score(np.r_[np.ones(p.size), np.zeros(q.size)], np.r_[p, q]))


def _reference_ends(runs: list[RunSample], seed: int) -> list[int | None]:
    """Where each run's window ends: the onset, or a matched position in a healthy run."""
    fractions = [r.onset / r.n_steps for r in runs if r.onset is not None]
    if not fractions:
        raise ValueError("the sample holds no collapsing run: draw more runs (n >= 50)")
    rng = np.random.default_rng(seed)
    ends: list[int | None] = []
    for run in runs:
        if run.onset is not None:
            ends.append(run.onset if run.onset >= WINDOW else None)
        else:
            ends.append(max(int(rng.choice(fractions) * run.n_steps), WINDOW))
    return ends


def separation_table(runs: list[RunSample], seed: int = 0) -> pd.DataFrame:
    """Per (signal, statistic): folded AUROC, collapsing last window vs healthy window.

    Columns ``signal, stat, auroc, n_collapsed, n_healthy, exempt`` (exempt: the
    signal is in :data:`EXEMPT` or the statistic not in :data:`BOUNDED_STATS`). Collapses whose
    label onset comes before step :data:`WINDOW` have no full window and are skipped.
    """
    ends = _reference_ends(runs, seed)
    rows = []
    for name in SIGNALS_READ:
        stats: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
        for run, end in zip(runs, ends, strict=True):
            if end is not None:
                values = run.signals[name]
                drift, curvature = window_stats(block_medians(values, end)[-4:])
                row = (float(drift[-1]), float(curvature[-1]), last_z(values, end))
                stats[run.onset is not None].append(row)
        for i, stat in enumerate(("drift", "curvature", "last_z")):
            a = auroc((s[i] for s in stats[True]), (s[i] for s in stats[False]))
            rows.append(
                {
                    "signal": name,
                    "stat": stat,
                    "auroc": max(a, 1 - a) if math.isfinite(a) else math.nan,
                    "n_collapsed": sum(math.isfinite(s[i]) for s in stats[True]),
                    "n_healthy": sum(math.isfinite(s[i]) for s in stats[False]),
                    "exempt": name in EXEMPT or stat not in BOUNDED_STATS,
                }
            )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Precursor:
    """A precursor the generator gives collapses, as a detector on the frame.

    Present in a window when the window statistic ``stat`` of ``signal`` is beyond
    ``threshold`` in ``direction`` (+1 above, -1 below); in a run when present in
    any window (every :data:`BLOCK` steps, counted back from the run's end or, for a
    collapse, from its onset) before the end or the onset.
    """

    name: str
    kinds: str  # which collapse kinds carry it (spec.kind), for the report
    signal: str
    stat: str  # "drift" or "curvature"
    direction: int
    threshold: float

    def strongest(self, run: RunSample) -> float:
        """The run's largest statistic in ``direction`` over its windows (before onset)."""
        end = run.n_steps if run.onset is None else run.onset
        drift, curvature = window_stats(block_medians(run.signals[self.signal], end))
        values = self.direction * (drift if self.stat == "drift" else curvature)
        # window i ends at end - BLOCK * (len - 1 - i): keep those after the warmup
        ends = end - BLOCK * np.arange(values.size)[::-1]
        values = values[np.isfinite(values) & (ends >= settled(run.n_steps))]
        return float(values.max()) if values.size else -math.inf


# Each threshold is the 90th percentile of the run's strongest window in healthy runs
# without decoys (SamplerConfig(decoy_share=0, decoys_per_kstep=0), 400 runs of seed 0,
# ~230 healthy): a run past it shows more than nine in ten decoy-free healthy runs do.
# The statistic is the one that separates the precursor from its background best:
# curvature where the background is a decelerating drift (parameter norm and logits
# grow, attention entropy falls, ever more slowly) and the precursor an accelerating
# ramp; drift where the precursor is a move of the level.
PRECURSORS: tuple[Precursor, ...] = (
    Precursor(
        "param_norm growth",
        "nonfinite, oscillation (larger updates)",
        "param_norm",
        "curvature",
        1,
        0.007,
    ),
    Precursor(
        "attention-logit growth",
        "attention_entropy, nonfinite, oscillation",
        "attn_logit_max",
        "curvature",
        1,
        0.19,
    ),
    Precursor(
        "attention-entropy fall", "attention_entropy", "attn_entropy_min", "curvature", -1, 0.52
    ),
    Precursor("gradient-norm blow-up", "nonfinite, oscillation", "grad_norm", "drift", 1, 0.62),
    Precursor(
        "bottom gradient vanishing", "gradient_collapse", "bottom_grad_share", "drift", -1, 0.058
    ),
    Precursor("update-ratio growth", "nonfinite, oscillation", "update_ratio", "drift", 1, 0.31),
    Precursor(
        "output-logit growth", "nonfinite, oscillation", "output_logit_max", "curvature", 1, 0.012
    ),
    # q90 and q95 of decoy-free healthy runs: 0 and 0.5 reversals; one more is a move
    Precursor("update reversals", "oscillation", "update_flips", "drift", 1, 1.0),
    Precursor(
        "update_cos fall (DSI)", "DSI collapses, oscillation", "update_cos", "drift", -1, 0.05
    ),
    Precursor("grad_cv rise (DSI)", "DSI collapses", "grad_cv", "drift", 1, 0.2),
    Precursor("attn_kl rise (DSI)", "DSI collapses", "attn_kl", "drift", 1, 0.29),
)


def precursor_rates(runs: list[RunSample]) -> pd.DataFrame:
    """Per precursor: share of collapsing runs (before onset) and healthy runs showing it."""
    rows = []
    collapsed = [r for r in runs if r.onset is not None]
    healthy = [r for r in runs if r.onset is None]
    for p in PRECURSORS:
        rate_c = float(np.mean([p.strongest(r) > p.threshold for r in collapsed]))
        rate_h = float(np.mean([p.strongest(r) > p.threshold for r in healthy]))
        rows.append(
            {
                "precursor": p.name,
                "kinds": p.kinds,
                "collapsing": rate_c,
                "healthy": rate_h,
                "ratio": rate_h / rate_c if rate_c > 0 else math.nan,
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collapse_guard.datasets.synthetic.shortcuts",
        description="Precursor rates and single-signal AUROC on synthetic runs.",
    )
    parser.add_argument("--n", type=int, default=400, help="runs to draw (default 400)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.n < 50:
        parser.error(f"--n must be >= 50 (enough collapses to compare), got {args.n}")
    runs = draw_sample(args.n, args.seed)
    n_c = sum(r.onset is not None for r in runs)
    print(f"{args.n} synthetic runs of seed {args.seed}: {n_c} collapsed, {args.n - n_c} healthy\n")
    print(markdown(precursor_rates(runs)), "\n")
    table = separation_table(runs, args.seed)
    wide = table.pivot(index="signal", columns="stat", values="auroc").loc[list(SIGNALS_READ)]
    wide = wide.reset_index()[["signal", "drift", "curvature", "last_z"]]
    wide["bounded"] = [
        "no: " + EXEMPT[n].split(":")[0] if n in EXEMPT else "drift, curvature" for n in wide.signal
    ]
    print(markdown(wide))
    return 0


def markdown(table: pd.DataFrame) -> str:
    """A Markdown table, floats with two decimals (no tabulate dependency)."""
    cells = [[f"{v:.2f}" if isinstance(v, float) else str(v) for v in row] for row in table.values]
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * table.shape[1]]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


if __name__ == "__main__":
    sys.exit(main())
