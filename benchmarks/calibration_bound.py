"""Levels set on K healthy runs, scored on healthy runs they never saw: the run as the unit
(issue 34, item 7) against the steps taken as independent (the method before it).

    python benchmarks/calibration_bound.py [--k 3 5 10] [--draws 100] [--corpus corpus/real]

Two sources of healthy runs, `warn` (1 false alarm per 10,000 healthy steps) at 90 %
confidence, the same draws for both methods (``healthy_levels(..., unit="run")`` and
``unit="step"``):

- **known law**: runs of 2,000 steps whose held risk sits near log-odds -3 with one hump
  (the warmup's end) to a peak whose log-odds follow a known law (normal, Gumbel), so a new
  run's chance to reach a level is known exactly: ``law.sf(logit(level))``. The target is
  2,000 / 10,000 = 20 %. Per K: the mean held-out chance, and the share of draws whose
  chance is within the target (the confidence asks 90 %).
- **corpus**: the healthy runs of ``--corpus`` that the bundled model never trained on,
  scored once by it (held risk at the recorded rows, as ``calibrate`` reads them), pooled
  as one set-up; per draw, K of them set the level and the others are scored: the share of
  held-out runs that reach it, and false alarms per 10k held-out healthy steps.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before lightgbm (docs/stack.md, "OpenMP")

import numpy as np
from scipy.stats import gumbel_r, norm

from collapse_guard.predictor.core.levels import DEFAULT_BUDGETS, episode_counts
from collapse_guard.predictor.core.recalibrate import UNITS, healthy_levels

RUN_STEPS = 2_000
LAWS = {"normal(-1.5, 0.4)": norm(-1.5, 0.4), "gumbel(-1.5, 0.3)": gumbel_r(-1.5, 0.3)}


def hump_run(rng: np.random.Generator, peak: float, steps: int = RUN_STEPS) -> np.ndarray:
    """A healthy run's held risk: log-odds near -3, one hump at the warmup's end to log-odds
    ``peak`` (its highest: the run's peak is ``expit(peak)``)."""
    t = np.arange(steps)
    centre = rng.integers(steps // 10, 3 * steps // 10)
    hump = np.exp(-0.5 * ((t - centre) / 40.0) ** 2)
    z = np.maximum(-3 + 0.1 * rng.standard_normal(steps), -3 + (peak + 3) * hump)
    return 1.0 / (1.0 + np.exp(-z))


def _logit(p: float) -> float:
    p = min(max(p, 1e-12), 1 - 1e-12)
    return float(np.log(p / (1 - p)))


def known_law(ks: list[int], draws: int) -> list[dict]:
    rows = []
    for name, law in LAWS.items():
        for k in ks:
            rng = np.random.default_rng(k)
            chance = {unit: [] for unit in UNITS}
            for _ in range(draws):
                runs = [hump_run(rng, z) for z in law.rvs(size=k, random_state=rng)]
                for unit in UNITS:
                    warn = healthy_levels(runs, DEFAULT_BUDGETS, unit=unit)["warn"]
                    chance[unit].append(law.sf(_logit(warn.threshold)))
            for unit in UNITS:
                held = np.asarray(chance[unit])
                rows.append(
                    {
                        "law": name,
                        "K": k,
                        "unit": unit,
                        "new run alarms (mean)": float(held.mean()),
                        "draws within 20 %": float(np.mean(held <= 0.2)),
                    }
                )
    return rows


def corpus_risks(folder: str) -> list[np.ndarray]:
    """Held risks, at recorded rows, of the healthy runs of ``folder`` the bundled model
    never trained on."""
    from collapse_guard.predictor.core.risk import RiskModel
    from collapse_guard.predictor.core.seen_runs import SeenRuns
    from collapse_guard.runfiles.records import find_run_files, load_runs

    model = RiskModel.load()
    seen = SeenRuns.from_meta(model.meta)
    records = [
        r
        for r in load_runs(find_run_files([folder]))
        if r.meta.onset_step is None and seen.role_of(r.run_id) != "train"
    ]
    return [
        model.predict_run(r.frame, steps=r.frame["step"].to_numpy()).to_numpy() for r in records
    ]


def corpus(risks: list[np.ndarray], ks: list[int], draws: int) -> list[dict]:
    peaks = np.array([np.nanmax(r) for r in risks])
    rows = []
    for k in ks:
        rng = np.random.default_rng(k)
        tally = {unit: [0, 0, 0, 0] for unit in UNITS}  # alarmed runs, runs, episodes, steps
        for _ in range(draws):
            chosen = rng.choice(len(risks), size=k, replace=False)
            rest = np.setdiff1d(np.arange(len(risks)), chosen)
            for unit in UNITS:
                level = healthy_levels([risks[i] for i in chosen], DEFAULT_BUDGETS, unit=unit)
                threshold = level["warn"].threshold
                counts = tally[unit]
                counts[0] += int(np.sum(peaks[rest] >= threshold))
                counts[1] += rest.size
                counts[2] += int(episode_counts([risks[i] for i in rest], [threshold])[0])
                counts[3] += int(sum(risks[i].size for i in rest))
        for unit, (alarmed, runs, episodes, steps) in tally.items():
            rows.append(
                {
                    "K": k,
                    "unit": unit,
                    "held-out runs alarmed": alarmed / runs,
                    "FA per 10k": 1e4 * episodes / steps,
                }
            )
    return rows


def _print(rows: list[dict]) -> None:
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()]
        print("| " + " | ".join(cells) + " |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, nargs="+", default=[3, 5, 10])
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--corpus", default="corpus/real", help="'' skips the corpus")
    args = parser.parse_args()
    print(f"known law: warn, runs of {RUN_STEPS:,} steps, a new run may alarm with 20 %")
    _print(known_law(args.k, args.draws))
    if args.corpus:
        risks = corpus_risks(args.corpus)
        mean_steps = np.mean([r.size for r in risks])
        z = np.array([_logit(np.nanmax(r)) for r in risks])
        print(
            f"corpus: {len(risks)} healthy runs the bundled model never trained on, "
            f"{mean_steps:,.0f} rows each on average (warn target "
            f"{mean_steps / DEFAULT_BUDGETS['warn']:.1%}); their peaks' log-odds "
            f"{z.mean():.2f} +- {z.std(ddof=1):.2f}"
        )
        _print(corpus(risks, args.k, args.draws))


if __name__ == "__main__":
    main()
