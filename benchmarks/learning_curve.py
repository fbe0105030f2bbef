"""Issue 34 item 3: the learning curve by breadth, so the next data step is chosen from a slope.

    python benchmarks/learning_curve.py --runs DIR [--runs DIR ...] --out FILE.jsonl
        [--by family,optimizer,qk_norm,precision] [--sizes 40,80,160,all] [--seeds 0,1]
        [--min-develops 5] [--report-only]

For each grouping of ``--by`` and each of its values with at least ``--min-develops``
collapses that develop, the runs of that value are the test runs and the runs of every
other value the *pool*. For each seed the pool is put in one seeded order whose every
prefix keeps the pool's shares of (family, optimizer, outcome) (:func:`nested_order`), and
a model is trained on the first ``size`` runs of it (``all``: the whole pool), so the
training sets of one seed are nested. Each training is the bundle's own
(``TrainConfig()``: the LightGBM settings of ``lifecycle.bundle``, ``n_jobs=1``; levels
cross-fitted by family among the training runs), the held-out runs set nothing, and
the model is read at its stored ``warn`` level:

- recall of the collapses that develop, caught 10-200 steps ahead, and their median lead;
- false alarms per 10k healthy steps, inside LR rises and outside (``features.rises``);
- the step ROC-AUC inside rises and outside.

``family`` and ``optimizer`` are ``evaluate.groups``' set-up groupings; ``qk_norm`` and
``precision`` (any other config key too) are architecture components read from the run's
config. A component that is a function of the family on these runs (every family has
one value of it) cannot be held out apart from the family: :func:`confounded_rows` says
which, from the runs.

Resumable: one JSON line per (grouping, held-out value, size, seed) is appended to
``--out`` as it finishes, and lines already there are not run again. ``--report-only``
prints the tables (Markdown) from ``--out``: per grouping, each held-out value and the
unweighted mean over values at each training size (mean over seeds), then the slope
per doubling of the training runs (least squares of each figure on log2 of the runs
trained and validated on, per held-out value, then the mean over values).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

# before lightgbm is imported: spinning OpenMP threads make a busy machine crawl
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np
import pandas as pd

from collapse_guard.predictor.evaluate import SETUP_GROUPINGS, UNKNOWN, setup_of
from collapse_guard.predictor.evaluate.groups import SYNTHETIC_FAMILY, held_out_group

__all__ = [
    "ALL",
    "FIGURES",
    "confounded_rows",
    "curve_rows",
    "fold_row",
    "group_of",
    "heldout_features",
    "learning_curve",
    "main",
    "nested_order",
    "read_rows",
    "slope_rows",
]

ALL = "all"  # the size that trains on the whole pool
DEFAULT_BY = ("family", "optimizer", "qk_norm", "precision")
DEFAULT_SIZES = (40, 80, 160, ALL)
DEFAULT_SEEDS = (0, 1)
MIN_DEVELOPS = 5  # a held-out value with fewer developing collapses gives no recall worth a row
# the figures of a row, as the tables name them
FIGURES = {
    "recall_develops": "recall (develops)",
    "median_lead": "median lead",
    "fa_per_10k": "FA/10k",
    "inside_fa_per_10k": "FA/10k in rises",
    "outside_fa_per_10k": "FA/10k outside",
    "inside_roc_auc": "AUC in rises",
    "outside_roc_auc": "AUC outside",
}
# the architecture components of a run's config that a component hold-out may name
COMPONENTS = ("norm", "positions", "mlp", "tied", "qk_norm", "attention", "block", "precision")


def group_of(meta, by: str) -> str:
    """The value of ``by`` a hold-out puts a run in: a set-up grouping as
    ``training.holdout`` has it, else the config key ``by`` (``unknown`` where absent);
    a synthetic run is always ``synthetic`` (trained on, never held out)."""
    if by in SETUP_GROUPINGS:
        return held_out_group(meta, by)
    if meta.source == "synthetic":
        return SYNTHETIC_FAMILY
    value = meta.config.get(by)
    return UNKNOWN if value is None else str(value)


def _stratum(meta) -> tuple[str, str, str]:
    onset = "healthy" if meta.onset_step is None else meta.extra.get("onset_kind") or UNKNOWN
    return setup_of(meta, "family"), setup_of(meta, "optimizer"), onset


def nested_order(metas: Sequence, seed: int) -> list[str]:
    """Run ids in a seeded order whose every prefix keeps the shares of each (family,
    optimizer, outcome) stratum: within a stratum of n runs, the k-th run of a seeded
    shuffle sits at (k + u) / n (u: one seeded offset per stratum), and the runs are
    taken in that order. Training on the first 40, 80, ... gives nested sets of the same
    make-up, so a size's gain is the size's, not a different mix's."""
    rng = np.random.default_rng(seed)
    strata: dict[tuple, list[str]] = {}
    for meta in sorted(metas, key=lambda m: m.run_id):
        strata.setdefault(_stratum(meta), []).append(meta.run_id)
    keyed = []
    for key in sorted(strata):
        ids = strata[key]
        offset = rng.random()
        keyed += [
            ((k + offset) / len(ids), ids[i]) for k, i in enumerate(rng.permutation(len(ids)))
        ]
    return [run_id for _, run_id in sorted(keyed)]


def _develops(report) -> tuple[int, int, float]:
    """(caught, n, median lead) of the collapses that develop, the model at warn."""
    point = report.headline_point("model")
    for g in report.groups:
        key = (g.scorer, g.source, g.operating_point, g.result.grouping, g.result.group)
        if key == ("model", "all", point, "onset", "develops"):
            e = g.result.events
            return e.caught, e.n_collapsed, e.median_lead
    return 0, 0, math.nan


def heldout_features(test: Sequence, config) -> list[pd.DataFrame]:
    """Each test run's feature rows at every recorded step, as ``RiskModel.predict_run``
    builds them: the same for every model of ``config``'s window and signals, so built
    once per held-out value instead of once per fold (0.2 s a run)."""
    from collapse_guard.features import FeatureExtractor

    extractor = FeatureExtractor(window=config.window, signals=config.signals)
    return [extractor.transform_run(r.frame, steps=r.frame["step"].to_numpy()) for r in test]


def _risk(model, features: Sequence[pd.DataFrame]) -> list[np.ndarray]:
    """``model.predict_run`` (held risk) from feature rows already built, every run's
    rows in one LightGBM call (not one call per run)."""
    from collapse_guard.predictor.core.hold import hold_risk

    p = np.split(
        model.predict_features(pd.concat(features)), np.cumsum([len(f) for f in features])[:-1]
    )
    return [hold_risk(f.index, pf, model.hold_steps) for f, pf in zip(features, p, strict=True)]


def fold_row(
    test: Sequence,
    pool: Sequence,
    config,
    *,
    validation_share: float = 0.25,
    rows=None,
    features: Sequence[pd.DataFrame] | None = None,
) -> dict:
    """Train on ``pool`` (split by run into train and validation as ``training.holdout``
    splits its rest), evaluate on ``test`` at the stored warn level: one row's figures,
    with the ids each part used. ``rows``: a training-row builder (a shared ``RowCache``);
    ``features``: :func:`heldout_features` of ``test``."""
    from collapse_guard.predictor.evaluate import evaluate_runs
    from collapse_guard.predictor.training.data import build_training_data
    from collapse_guard.predictor.training.holdout import train_validation_split
    from collapse_guard.predictor.training.train import fit_and_level

    train, val = train_validation_split(pool, config.seed, validation_share)
    model = fit_and_level(train, val, config, rows=rows or build_training_data)
    report = evaluate_runs(
        test,
        model,
        budget_per_10k=config.eval_budget_per_10k,
        horizon=config.horizon,
        model_scores=_risk(model, features or heldout_features(test, config)),
        groupings=("onset",),
    )
    flat = report.result("model").flat()
    caught, n, lead = _develops(report)
    return {
        "n_train": len(train),
        "n_validation": len(val),
        "n_test": len(test),
        "develops": n,
        "caught": caught,
        "recall_develops": caught / n if n else math.nan,
        "median_lead": lead,
        **{k: flat[k] for k in FIGURES if k not in ("recall_develops", "median_lead")},
        "healthy_steps": flat["healthy_steps"],
        "inside_healthy_steps": flat["inside_healthy_steps"],
        "warn": flat["threshold"],
        "levels_from": model.meta["levels_from"]["runs"],
        "train_ids": sorted(r.run_id for r in train),
        "validation_ids": sorted(r.run_id for r in val),
        "test_ids": sorted(r.run_id for r in test),
    }


def _held_out_values(runs: Sequence, by: str, min_develops: int) -> list[str]:
    """The values of ``by`` worth holding out: at least ``min_develops`` collapses that
    develop, and some other value's runs left to train on."""
    develops: dict[str, int] = {}
    for r in runs:
        value = group_of(r.meta, by)
        develops[value] = develops.get(value, 0) + (r.meta.extra.get("onset_kind") == "develops")
    values = sorted(set(develops) - {SYNTHETIC_FAMILY, UNKNOWN})
    return [v for v in values if develops[v] >= min_develops] if len(values) > 1 else []


def _sizes_of(sizes: Iterable, pool: int) -> list:
    """The sizes smaller than the pool, then ``all`` (a size at or over the pool is ``all``)."""
    return [s for s in sizes if s != ALL and int(s) < pool] + [ALL]


def learning_curve(
    runs: Sequence,
    out: Path,
    *,
    by: Sequence[str] = DEFAULT_BY,
    sizes: Sequence = DEFAULT_SIZES,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    min_develops: int = MIN_DEVELOPS,
    config=None,
    progress=None,
) -> list[dict]:
    """Every (grouping, held-out value, size, seed) row not yet in ``out``, appended to it
    as it finishes (module docstring); returns every row in ``out``. ``config``: the
    training (default ``TrainConfig()``, the bundle's); ``progress``: called with a line
    per row."""
    from collapse_guard.predictor.training.config import TrainConfig
    from collapse_guard.predictor.training.data import RowCache

    config = TrainConfig.of(config)
    done = {_key(r) for r in read_rows(out)}
    rows = RowCache()  # a run's feature rows are the same in every fold it trains in
    for grouping in by:
        for value in _held_out_values(runs, grouping, min_develops):
            test = [r for r in runs if group_of(r.meta, grouping) == value]
            rest = [r for r in runs if group_of(r.meta, grouping) != value]
            by_id = {r.run_id: r for r in rest}
            features = None  # built at this value's first row to run
            for seed in seeds:
                order = nested_order([r.meta for r in rest], seed)
                for size in _sizes_of(sizes, len(rest)):
                    key = (grouping, value, str(size), seed)
                    if key in done:
                        continue
                    pool = [by_id[i] for i in (order if size == ALL else order[: int(size)])]
                    start = time.perf_counter()
                    features = features or heldout_features(test, config)
                    try:
                        row = fold_row(
                            test, pool, config.replace(seed=seed), rows=rows, features=features
                        )
                    except ValueError as error:
                        # too few runs to fit or calibrate (a part without a collapse's
                        # rows): kept, so the table says which sizes could not be trained
                        row = {"error": str(error).split(". Fix")[0]}
                    row = {
                        "by": grouping,
                        "group": value,
                        "size": str(size),
                        "seed": seed,
                        "n_pool": len(pool),
                        **row,
                        "seconds": round(time.perf_counter() - start, 1),
                    }
                    with open(out, "a") as f:
                        f.write(json.dumps(row, allow_nan=True) + "\n")
                    if progress is not None:
                        progress(_said(row))
    return read_rows(out)


def _said(row: dict) -> str:
    head = f"{row['by']}={row['group']} size {row['size']} seed {row['seed']}"
    if "error" in row:
        return f"{head}: not trained ({row['error']})"
    return (
        f"{head}: recall {row['recall_develops']:.2f}, FA/10k {row['fa_per_10k']:.2f} "
        f"({row['seconds']:.0f} s)"
    )


def _key(row: dict) -> tuple:
    return row["by"], row["group"], row["size"], row["seed"]


def read_rows(path: Path) -> list[dict]:
    """The rows in ``path`` (none when it does not exist yet)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _trained(rows: Sequence[dict], by: str) -> pd.DataFrame:
    """The rows of ``by`` whose model was trained, with ``n_runs`` (trained + validated on)."""
    frame = pd.DataFrame([r for r in rows if r["by"] == by and "error" not in r])
    if not frame.empty:
        frame["n_runs"] = frame["n_train"] + frame["n_validation"]
    return frame


def curve_rows(rows: Sequence[dict], by: str) -> list[dict]:
    """One row per (held-out value, size), then ``mean`` per size (unweighted over
    values): seeds trained and ``not trained`` (seeds whose pool was too small to fit or
    calibrate), runs in the pool (trained + validated on), caught/develops summed over
    seeds, the stored warn level and every figure, each the mean over trained seeds."""
    figures = ["n_pool", "warn", *FIGURES]
    frame = pd.DataFrame([r for r in rows if r["by"] == by])
    if frame.empty:
        return []
    # an untrained row has no figures: NaN, skipped by the means
    frame = frame.reindex(columns=[*frame.columns.union(figures), "error", "caught", "develops"])
    frame = frame.loc[:, ~frame.columns.duplicated()]
    frame["trained"] = frame["error"].isna()
    per = frame.groupby(["group", "size"], sort=False)
    table = per[figures].mean()
    table["seeds"] = per["trained"].sum()
    table["not trained"] = per["trained"].count() - table["seeds"]
    caught, develops = (per[k].sum().astype(int).astype(str) for k in ("caught", "develops"))
    table["caught"] = caught + "/" + develops
    table = table.reset_index()
    # each value's sizes smallest first
    order = {g: i for i, g in enumerate(dict.fromkeys(table["group"]))}
    table = table.sort_values(
        ["group", "size"], key=lambda c: c.map(order) if c.name == "group" else c.map(_size_rank)
    )
    # the mean over the values trained at that size (an untrained value has no figures)
    per_size = table[table["seeds"] > 0].groupby("size", sort=False)
    mean = per_size[figures].mean()
    mean["seeds"] = per_size["seeds"].min()
    mean["not trained"] = table.groupby("size")["not trained"].sum().reindex(mean.index)
    mean = mean.reset_index()
    mean["group"], mean["caught"] = "mean", ""
    out = pd.concat([table, mean], ignore_index=True)
    return [
        {
            by: r["group"],
            "size": r["size"],
            "seeds": int(r["seeds"]),
            "not trained": int(r["not trained"]),
            "runs": round(r["n_pool"]),
            "caught": r["caught"],
            "warn": r["warn"],  # the stored level: what the recall column is read at
            **{FIGURES[k]: r[k] for k in FIGURES},
        }
        for _, r in out.iterrows()
    ]


def _size_rank(size: str) -> float:
    return math.inf if size == ALL else float(size)


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    keep = np.isfinite(y)
    if keep.sum() < 2 or np.ptp(x[keep]) == 0:
        return math.nan
    return float(np.polyfit(x[keep], y[keep], 1)[0])


def slope_rows(rows: Sequence[dict], by: str) -> list[dict]:
    """Per held-out value and the mean over values: each figure's least-squares slope
    on log2(runs trained and validated on), every trained seed a point: its change per
    doubling of the data (NaN: fewer than two sizes with a finite value)."""
    frame = _trained(rows, by)
    out = []
    for group, part in frame.groupby("group", sort=False) if not frame.empty else ():
        x = np.log2(part["n_runs"].to_numpy(float))
        out.append({by: group, **{FIGURES[k]: _slope(x, part[k].to_numpy(float)) for k in FIGURES}})
    if out:
        mean = pd.DataFrame(out).drop(columns=[by]).mean()  # NaN (no slope) skipped
        out.append({by: "mean", **mean.to_dict()})
    return out


def confounded_rows(metas: Sequence) -> list[dict]:
    """Per architecture component of the runs' configs: its values, and whether it can be
    held out apart from the model family (no: every family has a single value of it)."""
    real = [m for m in metas if m.source != "synthetic"]
    out = []
    for name in COMPONENTS:
        per_family: dict[str, set] = {}
        for m in real:
            per_family.setdefault(setup_of(m, "family"), set()).add(
                str(m.config.get(name, UNKNOWN))
            )
        values = sorted(set().union(*per_family.values())) if per_family else []
        fixed = all(len(v) == 1 for v in per_family.values())
        out.append(
            {
                "component": name,
                "values": ", ".join(values),
                "separable from family": "—" if len(values) < 2 else "no" if fixed else "yes",
                "per family": "; ".join(
                    f"{f}: {', '.join(sorted(v))}" for f, v in sorted(per_family.items())
                ),
            }
        )
    return out


def _report(rows: Sequence[dict], metas: Sequence | None) -> str:
    from predictor_eval import markdown_table

    parts = []
    for by in dict.fromkeys(r["by"] for r in rows):
        parts.append(
            markdown_table(
                f"leave-one-{by}-out by training runs: the model at its stored warn level "
                "(mean over seeds; runs = trained + validated on)",
                curve_rows(rows, by),
            )
        )
        parts.append(
            markdown_table(
                f"leave-one-{by}-out: change per doubling of the training runs (least squares "
                "on log2 runs)",
                slope_rows(rows, by),
            )
        )
    if metas is not None:
        parts.append(markdown_table("components beside the model family", confounded_rows(metas)))
    return "\n".join(parts)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, action="append", default=[], metavar="DIR")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, appended to")
    parser.add_argument("--by", default=",".join(DEFAULT_BY), help="groupings, comma list")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)))
    parser.add_argument("--min-develops", type=int, default=MIN_DEVELOPS)
    parser.add_argument("--report-only", action="store_true", help="print the tables of --out")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from collapse_guard.runfiles.records import find_run_files, load_runs

    # only finished run files: a sweep still writing leaves *.tmp beside them
    paths = [p for p in find_run_files(args.runs) if p.suffix == ".parquet"] if args.runs else []
    if not args.report_only:
        if not paths:
            raise SystemExit(f"no run files under {args.runs}; fix: --runs corpus/real")
        runs = load_runs(paths)
        print(f"{len(runs)} runs from {', '.join(map(str, args.runs))}", file=sys.stderr)
        sizes = [s if s == ALL else int(s) for s in args.sizes.split(",")]
        learning_curve(
            runs,
            args.out,
            by=args.by.split(","),
            sizes=sizes,
            seeds=[int(s) for s in args.seeds.split(",")],
            min_develops=args.min_develops,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    rows = read_rows(args.out)
    if not rows:
        raise SystemExit(f"no rows in {args.out}; fix: run without --report-only first")
    from collapse_guard.runfiles import read_meta

    print(_report(rows, [read_meta(p) for p in paths] if paths else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
