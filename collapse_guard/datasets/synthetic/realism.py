"""Do synthetic runs look like real ones? Per-run statistics and a two-set comparison.

:func:`run_stats` reduces one run file to a few numbers that a predictor leans on
(region: after the first 20% of steps, before onset, unless said otherwise):

======================  =========================================================
statistic               what
======================  =========================================================
``loss_level``          median loss, nats
``loss_noise``          robust std (1.4826 x MAD) of one-step loss differences
``grad_norm_level``     median gradient norm
``grad_norm_noise``     robust std of one-step differences of ln(gradient norm)
``grad_cv_level``       median ``grad_cv`` (a DSI signal: its threshold is 0.45)
``update_cos_level``    median ``update_cos`` (DSI: thresholds 0.1 and 0.9)
``attn_kl_level``       median ``attn_kl`` (DSI: thresholds 0.2 and 1.5)
``attn_logit_level``    median max attention logit
``attn_entropy_level``  median mean attention entropy, nats
``pre_loss_drift``      collapses: median loss in [onset-50, onset) minus in
                        [onset-H, onset-H+50), nats (H = the horizon, 200 steps:
                        the drift a forecast can see)
``pre_entropy_drift``   collapses: the same for mean attention entropy, nats
``pre_logit_drift``     collapses: the same for log10 of the max attention logit
``collapse_rise``       collapses that stay finite: median finite loss in
                        (onset+50, onset+300] minus median in [onset-100, onset),
                        nats, capped at :data:`RISE_CAP`
``onset_frac``          collapses: onset step / last step
======================  =========================================================

plus, over a whole set, ``collapse_share``. :func:`compare_run_sets` compares two
sets (e.g. real vs synthetic) statistic by statistic: the shift of the medians (a
ratio for levels, a difference for drifts and shares) and the two-sample
Kolmogorov-Smirnov statistic, each against a stated bound in :data:`BOUNDS` widened
by the sampling noise of the two sets (at 3 standard errors for the medians, at
``alpha`` for KS): small sets are judged only on differences they can show.

The noise is robust (MAD) on purpose: one-step data spikes and recovered spikes
are their own phenomena; a plain std would let three spikes set a run's "noise".

Non-finite and exploded losses. A run labelled ``nonfinite`` has no finite level to
rise to: it gets no ``collapse_rise`` (its pre-onset drifts still count). Real
divergences can also stay finite and explode (losses of 1e6 after a bf16 blow-up):
their rise is capped at :data:`RISE_CAP` nats (more than a uniform guess over 256
bytes costs), so one exploded run moves a median or a KS statistic by one rank,
not by a million nats.

The real side is committed as a small JSON reference (:data:`REFERENCE_PATH`: the
per-run values of every statistic over the real runs, and how they were made), so
the realism test needs no real runs at hand; regenerate it with::

    python -m collapse_guard.datasets.synthetic.realism --real data/real --write-reference

and compare the generator's defaults with it (or with a folder of real runs)::

    python -m collapse_guard.datasets.synthetic.realism --synthetic 200
    python -m collapse_guard.datasets.synthetic.realism --synthetic 200 --real data/real
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import ks_2samp

from collapse_guard.runfiles import RunMeta, list_runs, read_run
from collapse_guard.runfiles.label import HORIZON

__all__ = [
    "BOUNDS",
    "REFERENCE_PATH",
    "RISE_CAP",
    "STATS",
    "STATS_VERSION",
    "Bound",
    "RealismReport",
    "StatDistance",
    "compare_run_sets",
    "compare_stats",
    "compare_to_reference",
    "load_reference",
    "main",
    "make_reference",
    "real_run_files",
    "run_stats",
    "stats_table",
    "write_reference",
]

SETTLE_FRAC = 0.2  # skip the warmup transient: the first 20% of a run's steps
MIN_RUNS = 5  # fewer runs than this on either side: the statistic is reported, not judged
RISE_CAP = 6.0  # nats; ln(256) = 5.5 is a uniform guess: beyond it the run exploded
_EDGE = 50  # steps: each end of the horizon before onset whose medians a drift compares
# Bump whenever run_stats changes what it measures: the stored reference names it.
STATS_VERSION = 2
REFERENCE_PATH = Path(__file__).with_name("real_reference.json")


@dataclass(frozen=True)
class Bound:
    """How far two sets may differ on one statistic.

    ``shift`` is "ratio" (median_b / median_a within [1/limit, limit]), "diff"
    (|median_b - median_a| <= limit) or "share" (of collapsed runs: |share_b -
    share_a| <= limit). Each limit is widened by the sets' sampling noise.
    ``max_ks``: the KS statistic may exceed the sampling noise at ``alpha`` only up
    to this (distributions of this width can differ in detail; beyond it they
    describe different runs).
    """

    shift: str
    limit: float
    max_ks: float = 0.4


# Bounds, each with its reason. A KS statistic of 0.4 means the two sets' ECDFs are
# nowhere more than 40 percentage points apart: the same regime, different details.
BOUNDS: dict[str, Bound] = {
    # The real small runs span 1.8-2.7 nats after warmup: 15% of the median (~0.35 nats)
    # is about the label's margin; more would put the healthy level in another regime.
    "loss_level": Bound("ratio", 1.15),
    # Batch noise sets how hard a rise is to see: 1.3x is one batch-size step (8 -> 12).
    "loss_noise": Bound("ratio", 1.3),
    # Gradient-norm and logit levels depend on init and width: a factor 2 on either
    # side of the median, no more (the predictor's z-scores are scale-free, its raw
    # levels are not).
    "grad_norm_level": Bound("ratio", 2.0),
    "grad_norm_noise": Bound("ratio", 1.5),
    # The DSI signals decide the seed's rule: their levels relative to the thresholds
    # (0.45; 0.1/0.9; 0.2/1.5) must be where the real ones are.
    "grad_cv_level": Bound("ratio", 1.25),
    "update_cos_level": Bound("diff", 0.05),
    "attn_kl_level": Bound("ratio", 2.0),
    "attn_logit_level": Bound("ratio", 2.0, max_ks=0.5),
    "attn_entropy_level": Bound("ratio", 1.2),
    # Precursor drifts: what the predictor learns from. Measured drifts are hundredths
    # to tenths of a nat (a decade for the logits): within 0.1 nats (0.15 nats of
    # entropy, 0.25 decades of logit) of the real median; a synthetic precursor much
    # stronger than the real one would make the synthetic data easier.
    "pre_loss_drift": Bound("diff", 0.1),
    "pre_entropy_drift": Bound("diff", 0.15),
    "pre_logit_drift": Bound("diff", 0.25),
    # Collapses rise 0.3-1.5 nats here: within 0.25 nats of the median.
    "collapse_rise": Bound("diff", 0.25),
    "onset_frac": Bound("diff", 0.15),
    "collapse_share": Bound("share", 0.1),  # set-level: a share, no distribution
}
STATS: tuple[str, ...] = tuple(name for name, b in BOUNDS.items() if b.shift != "share")


def _median_in(steps: np.ndarray, values: np.ndarray, lo: float, hi: float) -> float:
    """Median of the finite values with lo <= step < hi (NaN when there are none)."""
    pick = (steps >= lo) & (steps < hi) & np.isfinite(values)
    return float(np.median(values[pick])) if pick.any() else math.nan


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name not in frame.columns:
        return np.full(len(frame), math.nan)
    return frame[name].to_numpy(dtype=np.float64)


def _step_noise(steps: np.ndarray, values: np.ndarray, region: np.ndarray) -> float:
    """Robust std of one-step differences, only between rows one step apart."""
    idx = np.flatnonzero(region & np.isfinite(values))
    consecutive = idx[1:][np.diff(steps[idx]) == 1]
    diffs = values[consecutive] - values[consecutive - 1]
    if diffs.size < 20:
        return math.nan
    return float(1.4826 * np.median(np.abs(diffs - np.median(diffs))))


def _log10(values: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(values > 0, np.log10(np.where(values > 0, values, 1.0)), math.nan)


def run_stats(frame: pd.DataFrame, meta: RunMeta) -> dict[str, float]:
    """The statistics of one run (see the module docstring); NaN where undefined."""
    steps = frame["step"].to_numpy(dtype=np.int64)
    loss = _column(frame, "loss")
    onset = meta.onset_step
    first, last = (int(steps[0]), int(steps[-1])) if steps.size else (0, 0)
    settled = first + SETTLE_FRAC * (last - first)
    end = onset if onset is not None else last + 1
    region = (steps >= settled) & (steps < end)

    stats = {"loss_level": _median_in(steps, loss, settled, end)}
    for name, signal in (
        ("grad_norm_level", "grad_norm"),
        ("grad_cv_level", "grad_cv"),
        ("update_cos_level", "update_cos"),
        ("attn_kl_level", "attn_kl"),
        ("attn_logit_level", "attn_logit_max"),
        ("attn_entropy_level", "attn_entropy_mean"),
    ):
        stats[name] = _median_in(steps, _column(frame, signal), settled, end)
    stats["loss_noise"] = _step_noise(steps, loss, region)
    grad = _column(frame, "grad_norm")
    with np.errstate(divide="ignore", invalid="ignore"):
        log_grad = np.where(grad > 0, np.log(np.where(grad > 0, grad, 1.0)), math.nan)
    stats["grad_norm_noise"] = _step_noise(steps, log_grad, region)

    nan = math.nan
    for name in ("pre_loss_drift", "pre_entropy_drift", "pre_logit_drift"):
        stats[name] = nan
    stats.update(collapse_rise=nan, onset_frac=nan)
    if onset is not None:
        entropy = _column(frame, "attn_entropy_mean")
        logit = _log10(_column(frame, "attn_logit_max"))
        for name, values in (
            ("pre_loss_drift", loss),
            ("pre_entropy_drift", entropy),
            ("pre_logit_drift", logit),
        ):
            stats[name] = _median_in(steps, values, onset - _EDGE, onset) - _median_in(
                steps, values, onset - HORIZON, onset - HORIZON + _EDGE
            )
        if meta.extra.get("collapse_kind") != "nonfinite":
            rise = _median_in(steps, loss, onset + 51, onset + 301) - _median_in(
                steps, loss, onset - 100, onset
            )
            stats["collapse_rise"] = min(rise, RISE_CAP) if math.isfinite(rise) else nan
        stats["onset_frac"] = (onset - first) / max(last - first, 1)
    return stats


def stats_table(paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """One row of :func:`run_stats` per run file, plus ``collapsed`` (0/1)."""
    rows = []
    for path in paths:
        frame, meta = read_run(path)
        rows.append(
            {
                **run_stats(frame, meta),
                "collapsed": float(meta.onset_step is not None),
                "collapse_kind": meta.extra.get("collapse_kind") or "",
            }
        )
    return pd.DataFrame(rows)


def _ks_noise(n_a: int, n_b: int, alpha: float) -> float:
    """KS value two samples of these sizes exceed with probability ``alpha`` when equal."""
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n_a + n_b) / (n_a * n_b))


@dataclass(frozen=True)
class StatDistance:
    """One statistic compared between set A (reference) and set B."""

    name: str
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    shift: float  # ratio b/a or difference b - a, per the bound
    shift_limit: float  # the bound's limit widened by the sets' sampling noise
    ks: float  # NaN for set-level statistics
    ks_limit: float
    bound: Bound
    judged: bool  # False: too few runs on a side, reported only
    passed: bool

    def line(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        if not self.judged:
            verdict = "n/a (too few runs)"
        op = "x" if self.bound.shift == "ratio" else "+"
        return (
            f"{self.name:<19} A {self.median_a:>10.4g} (n={self.n_a:<4}) B {self.median_b:>10.4g} "
            f"(n={self.n_b:<4}) shift {op}{self.shift:.3g} (limit {self.bound.limit:g}, "
            f"with noise {self.shift_limit:.3g})  "
            f"KS {self.ks:.2f} (limit {self.ks_limit:.2f})  {verdict}"
        )


@dataclass(frozen=True)
class RealismReport:
    distances: tuple[StatDistance, ...]

    @property
    def passed(self) -> bool:
        return all(d.passed for d in self.distances)

    @property
    def failures(self) -> list[str]:
        return [d.name for d in self.distances if not d.passed]

    def summary(self) -> str:
        head = "realism: " + ("pass" if self.passed else f"FAIL ({', '.join(self.failures)})")
        return "\n".join([head, *(d.line() for d in self.distances)])

    def table(self, a: str = "real", b: str = "synthetic") -> str:
        """A Markdown table: statistic, both medians (n), shift and KS against their bounds."""
        lines = [
            f"| statistic | {a} median (n) | {b} median (n) | shift (bound, with noise) "
            "| KS (bound) | pass |",
            "|---|---|---|---|---|---|",
        ]
        for d in self.distances:
            op = "x" if d.bound.shift == "ratio" else "+"
            rule = f"1/{d.bound.limit:g}..{d.bound.limit:g}" if op == "x" else f"±{d.bound.limit:g}"
            noisy = f"{d.shift_limit:.3g}" if op == "x" else f"±{d.shift_limit:.3g}"
            ks = "" if math.isnan(d.ks) else f"{d.ks:.2f} (≤ {d.ks_limit:.2f})"
            verdict = ("pass" if d.passed else "FAIL") if d.judged else "n/a (too few runs)"
            lines.append(
                f"| {d.name} | {d.median_a:.4g} ({d.n_a}) | {d.median_b:.4g} ({d.n_b}) "
                f"| {op}{d.shift:.3g} ({rule}, {noisy}) | {ks} | {verdict} |"
            )
        return "\n".join(lines)


def _median_noise(va: np.ndarray, vb: np.ndarray) -> float:
    """3 standard errors of a difference of medians (robust pooled spread)."""
    pooled = np.concatenate([va, vb])
    sigma = 1.4826 * float(np.median(np.abs(pooled - np.median(pooled))))
    return 3 * 1.2533 * sigma * math.sqrt(1 / va.size + 1 / vb.size)


def _shift(bound: Bound, va: np.ndarray, vb: np.ndarray) -> tuple[float, float, float, float]:
    """``(median_a, median_b, shift, allowed)``; allowed is in the shift's own units."""
    if bound.shift == "ratio":
        med_a, med_b = float(np.median(va)), float(np.median(vb))
        if not (med_a > 0 and med_b > 0 and (va > 0).all() and (vb > 0).all()):
            return med_a, med_b, math.nan, math.nan
        noise = _median_noise(np.log(va), np.log(vb))
        return med_a, med_b, med_b / med_a, bound.limit * math.exp(noise)
    if bound.shift == "share":
        med_a, med_b = float(va.mean()), float(vb.mean())
        p = (va.sum() + vb.sum()) / (va.size + vb.size)
        noise = 3 * math.sqrt(p * (1 - p) * (1 / va.size + 1 / vb.size))
        return med_a, med_b, med_b - med_a, bound.limit + noise
    med_a, med_b = float(np.median(va)), float(np.median(vb))
    return med_a, med_b, med_b - med_a, bound.limit + _median_noise(va, vb)


def _shift_ok(bound: Bound, shift: float, allowed: float) -> bool:
    if bound.shift == "ratio":
        return 1 / allowed <= shift <= allowed  # False for NaN
    return abs(shift) <= allowed


def compare_stats(
    a: pd.DataFrame,
    b: pd.DataFrame,
    bounds: Mapping[str, Bound] = BOUNDS,
    *,
    alpha: float = 1e-3,
) -> RealismReport:
    """Compare two :func:`stats_table` frames, A the reference (real), B the candidate."""
    out = []
    for name, bound in bounds.items():
        column = "collapsed" if bound.shift == "share" else name
        va, vb = a[column].to_numpy(float), b[column].to_numpy(float)
        va, vb = va[np.isfinite(va)], vb[np.isfinite(vb)]
        if min(va.size, vb.size) < MIN_RUNS:
            med_a = float(np.median(va)) if va.size else math.nan
            med_b = float(np.median(vb)) if vb.size else math.nan
            nan = math.nan
            out.append(
                StatDistance(
                    name, va.size, vb.size, med_a, med_b, nan, nan, nan, nan, bound, False, True
                )
            )
            continue
        med_a, med_b, shift, allowed = _shift(bound, va, vb)
        ks, ks_limit, ks_ok = math.nan, math.nan, True
        if bound.shift != "share":
            # the two-sample KS statistic (largest gap between the ECDFs); only the
            # statistic is read (the bound is ours), so the asymptotic p-value is cheapest
            ks = float(ks_2samp(va, vb, method="asymp").statistic)
            ks_limit = max(bound.max_ks, _ks_noise(va.size, vb.size, alpha))
            ks_ok = ks <= ks_limit
        passed = _shift_ok(bound, shift, allowed) and ks_ok
        out.append(
            StatDistance(
                name,
                va.size,
                vb.size,
                med_a,
                med_b,
                shift,
                allowed,
                ks,
                ks_limit,
                bound,
                True,
                passed,
            )
        )
    return RealismReport(tuple(out))


def compare_run_sets(
    reference: Iterable[str | os.PathLike],
    candidate: Iterable[str | os.PathLike],
    bounds: Mapping[str, Bound] = BOUNDS,
    *,
    alpha: float = 1e-3,
) -> RealismReport:
    """Compare two sets of run files (e.g. real = reference, synthetic = candidate)."""
    return compare_stats(stats_table(reference), stats_table(candidate), bounds, alpha=alpha)


# ---------------------------------------------------------------------------------------
# The committed reference: per-run statistics of real runs, without the runs.


def _significant(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}")


def make_reference(
    table: pd.DataFrame, *, command: str = "", source: Mapping[str, object] | None = None
) -> dict:
    """A JSON-able reference from a :func:`stats_table` of real runs.

    Every statistic keeps its per-run finite values (sorted, 4 significant digits:
    enough for a median and a KS statistic, small enough to commit); ``collapsed``
    keeps the count. ``source`` says where the runs came from.
    """
    stats = {}
    for name in STATS:
        values = table[name].to_numpy(float) if name in table.columns else np.array([])
        stats[name] = [_significant(v) for v in np.sort(values[np.isfinite(values)])]
    kinds = Counter(k for k in table.get("collapse_kind", pd.Series(dtype=str)) if k)
    return {
        "what": "per-run statistics of real runs (collapse_guard.datasets.synthetic."
        "realism.run_stats); the realism test compares the synthetic generator "
        "with them",
        "stats_version": STATS_VERSION,
        "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "source": dict(source or {}),
        "n_runs": len(table),
        "n_collapsed": int(table["collapsed"].sum()),
        "collapse_kinds": dict(sorted(kinds.items())),
        "stats": stats,
    }


def _real_source(paths: list[Path]) -> dict:
    """What generated these real runs: generator, seeds, steps, label version, recipes."""
    from collapse_guard.runfiles import read_meta

    metas = [read_meta(p) for p in paths]
    folders = sorted({str(p.parent) for p in paths})
    steps = Counter(int(m.config.get("steps", 0)) for m in metas)
    seeds = sorted({p.name.split("-")[1] for p in paths if p.name.count("-") >= 2})
    return {
        "folders": folders,
        "files": len(paths),
        "generator": "collapse_guard.datasets.real (collapse-guard data real)",
        "seeds": seeds,
        "steps": {str(k): v for k, v in sorted(steps.items())},
        "label_versions": sorted({str(m.label_version) for m in metas}),
        "recipes": dict(sorted(Counter(str(m.config.get("recipe")) for m in metas).items())),
        "torch_versions": sorted({str(m.extra.get("torch_version")) for m in metas}),
    }


def real_run_files(folder: str | os.PathLike) -> list[Path]:
    """Finished run files under ``folder`` (``*.parquet``; ``*.parquet.tmp`` are skipped)."""
    paths = list_runs(folder)
    if not paths:
        raise FileNotFoundError(f"no finished run files (*.parquet) under {folder}")
    return paths


def _dumps(reference: dict) -> str:
    """Indented JSON with each statistic's values on one line (a diff shows what moved)."""
    stats = reference["stats"]
    head = json.dumps({**reference, "stats": {}}, indent=1, ensure_ascii=False)
    lines = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in stats.items())
    return head.replace('"stats": {}', '"stats": {\n' + lines + "\n }") + "\n"


def write_reference(
    folders: Iterable[str | os.PathLike],
    out: str | os.PathLike = REFERENCE_PATH,
    *,
    command: str = "",
) -> dict:
    """Compute the statistics of every finished run under ``folders`` and write the JSON."""
    paths = [p for folder in folders for p in real_run_files(folder)]
    reference = make_reference(stats_table(paths), command=command, source=_real_source(paths))
    Path(out).write_text(_dumps(reference), encoding="utf-8")
    return reference


def load_reference(path: str | os.PathLike = REFERENCE_PATH) -> tuple[pd.DataFrame, dict]:
    """``(table, reference)``: the stored statistics as a frame :func:`compare_stats` takes.

    Columns have different lengths (drifts exist for collapses only), so each is
    padded with NaN, which the comparison drops.
    """
    reference = json.loads(Path(path).read_text(encoding="utf-8"))
    if reference.get("stats_version") != STATS_VERSION:
        raise ValueError(
            f"{path} holds statistics of version {reference.get('stats_version')!r}, but "
            f"run_stats is at version {STATS_VERSION}; regenerate it with `python -m "
            "collapse_guard.datasets.synthetic.realism --real DIR --write-reference`"
        )
    n = int(reference["n_runs"])
    columns = {}
    for name, values in reference["stats"].items():
        column = np.full(n, math.nan)
        column[: len(values)] = values
        columns[name] = column
    collapsed = np.zeros(n)
    collapsed[: int(reference["n_collapsed"])] = 1.0
    columns["collapsed"] = collapsed
    return pd.DataFrame(columns), reference


def compare_to_reference(
    candidate: Iterable[str | os.PathLike] | pd.DataFrame,
    reference: str | os.PathLike = REFERENCE_PATH,
    bounds: Mapping[str, Bound] = BOUNDS,
    *,
    alpha: float = 1e-3,
) -> RealismReport:
    """Compare run files (or their :func:`stats_table`) with the stored real reference."""
    table = candidate if isinstance(candidate, pd.DataFrame) else stats_table(candidate)
    real, _ = load_reference(reference)
    return compare_stats(real, table, bounds, alpha=alpha)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collapse_guard.datasets.synthetic.realism",
        description="Compare the synthetic generator with real runs; write the reference.",
    )
    parser.add_argument("--real", action="append", type=Path, help="folder of real run files")
    parser.add_argument(
        "--write-reference",
        nargs="?",
        const=REFERENCE_PATH,
        type=Path,
        metavar="PATH",
        help=f"write the statistics of the --real runs as the reference (default {REFERENCE_PATH})",
    )
    parser.add_argument(
        "--synthetic", type=int, default=0, metavar="N", help="compare N synthetic runs"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic runs")
    parser.add_argument("--reference", type=Path, default=REFERENCE_PATH)
    args = parser.parse_args(argv)

    if args.write_reference is not None:
        if not args.real:
            parser.error("--write-reference needs --real DIR")
        command = (
            "python -m collapse_guard.datasets.synthetic.realism "
            + " ".join(f"--real {d}" for d in args.real)
            + " --write-reference"
        )
        reference = write_reference(args.real, args.write_reference, command=command)
        print(
            f"wrote {args.write_reference}: {reference['n_runs']} runs, "
            f"{reference['n_collapsed']} collapsed {reference['collapse_kinds']}"
        )
    if args.synthetic:
        import tempfile

        from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs

        if args.real and args.write_reference is None:
            real = stats_table(p for folder in args.real for p in real_run_files(folder))
            label = "real (" + ", ".join(map(str, args.real)) + ")"
        else:
            real, info = load_reference(args.reference)
            label = f"real ({args.reference.name}, {info['created']})"
        with tempfile.TemporaryDirectory(prefix="synth-realism-") as tmp:
            synth = stats_table(generate_synthetic_runs(args.synthetic, tmp, seed=args.seed))
        report = compare_stats(real, synth)
        print(f"{label} vs {args.synthetic} synthetic runs (seed {args.seed}, default sampler)")
        print(report.table())
        print(report.summary().splitlines()[0])
        return 0 if report.passed else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
