"""Retrain on a held-back kind of run: how much does the predictor gain on it?

For each group of the real runs (model family by default, ``config["family"]``; or the
fault recipe, ``config["recipe"]``):

1. the group's runs are dealt, stratified by outcome and seeded, into ``added`` (60 %) and
   ``held out`` (40 %);
2. the dataset is the synthetic runs plus the real runs of every other group; the first
   ``retrain`` (no new runs) makes the champion: the model **before**, which never saw the
   group;
3. ``retrain --runs added`` trains the challenger, the model **after**, compares the two by
   the promotion rule on the frozen benchmark and the new runs, and promotes it or not;
4. both are scored on the held-out runs of the group, which neither saw, each at its own
   stored ``warn`` level (``promotion.score_at_warn``): recall (caught 10-200 steps ahead),
   false alarms per 10k healthy steps, median lead.

Each group has its own MLflow experiment and registered model in one SQLite store under
``--work``. The production defaults train both models (LightGBM settings, budgets).

Usage::

    OMP_WAIT_POLICY=passive nice -n 10 python benchmarks/retrain_heldout.py \
        --real /root/cg-data/real --synthetic 150 [--grouping family] [--groups gpt,mha]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from collapse_guard.datasets.synthetic import SamplerConfig, generate_synthetic_runs
from collapse_guard.runfiles import list_runs, read_meta

__all__ = ["deal", "main"]

ADDED_SHARE = 0.6  # of a group's runs, added at retrain; the rest is held out


def deal(paths: list[Path], share: float, seed: int) -> tuple[list[Path], list[Path]]:
    """(added, held out): ``share`` of each outcome's runs, sorted by id then shuffled."""
    by_outcome: dict[bool, list[Path]] = defaultdict(list)
    for path in paths:
        by_outcome[read_meta(path).onset_step is not None].append(path)
    rng = np.random.default_rng(seed)
    added, held = [], []
    for outcome in sorted(by_outcome):
        group = sorted(by_outcome[outcome], key=lambda p: read_meta(p).run_id)
        order = rng.permutation(len(group))
        cut = round(share * len(group))
        added += [group[i] for i in order[:cut]]
        held += [group[i] for i in order[cut:]]
    return added, held


def _link_all(paths: list[Path], folder: Path) -> Path:
    folder.mkdir(parents=True)
    for path in paths:
        (folder / path.name).symlink_to(path.resolve())
    return folder


def _score(version: str, name: str, runs) -> dict[str, float]:
    from collapse_guard.predictor.core.risk import RiskModel
    from collapse_guard.predictor.lifecycle.promotion import score_at_warn, unseen_by

    model = RiskModel.load(f"models:/{name}/{version}")
    fair, seen = unseen_by([model], runs)
    assert seen == 0, f"v{version} saw {seen} held-out runs"
    s = score_at_warn(model, fair)
    return {
        "recall": s.recall,
        "caught": s.caught,
        "collapses": s.n_collapsed,
        "fa_per_10k": s.fa_per_10k,
        "median_lead": s.median_lead,
        "within_budget": s.within_budget,
    }


def run_group(group: str, members: list[Path], others: list[Path], args, work: Path) -> dict:
    from collapse_guard.predictor.lifecycle.retrain import retrain
    from collapse_guard.runfiles.records import load_runs

    t0 = time.perf_counter()
    added, held = deal(members, ADDED_SHARE, args.seed)
    folder = work / group
    base = _link_all(others, folder / "dataset")
    new = _link_all(added, folder / "added")
    name = f"heldout-{args.grouping}-{group}"
    before = retrain([], base=base, experiment=name, model_name=name, seed=args.seed)
    after = retrain([str(new)], base=base, experiment=name, model_name=name, seed=args.seed)
    held_runs = load_runs(held)
    row = {
        "group": group,
        "added": len(added),
        "held_out": len(held),
        "before": _score(before.version, name, held_runs),
        "after": _score(after.version, name, held_runs),
        "promoted": after.promoted,
        "reason": after.reason,
        "seconds": round(time.perf_counter() - t0),
    }
    print(json.dumps(row), flush=True)
    return row


def _fmt(score: dict) -> str:
    recall = "—" if math.isnan(score["recall"]) else f"{score['recall']:.2f}"
    lead = "—" if math.isnan(score["median_lead"]) else f"{score['median_lead']:.0f}"
    return (
        f"{recall} ({score['caught']}/{score['collapses']}), lead {lead}, "
        f"FA {score['fa_per_10k']:.1f}/10k"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", type=Path, required=True, help="folder of real run files")
    parser.add_argument("--synthetic", type=int, default=150, help="synthetic runs to add")
    parser.add_argument("--grouping", choices=("family", "recipe"), default="family")
    parser.add_argument("--groups", default="", help="comma-separated; default: every group")
    parser.add_argument("--work", type=Path, default=Path("/tmp/retrain_heldout"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{args.work / 'mlflow.db'}"
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    synthetic = generate_synthetic_runs(
        args.synthetic,
        args.work / "synthetic",
        seed=args.seed,
        config=SamplerConfig(min_steps=600, max_steps=1500),
    )
    real = list_runs(args.real)
    key = {path: read_meta(path).config.get(args.grouping, "unknown") for path in real}
    groups = args.groups.split(",") if args.groups else sorted(set(key.values()))
    rows = []
    for group in groups:
        members = [p for p in real if key[p] == group]
        others = synthetic + [p for p in real if key[p] != group]
        rows.append(run_group(group, members, others, args, args.work))
    print(f"\nheld-back {args.grouping}: before retrain -> after (at each model's own warn)")
    for r in rows:
        verdict = "promoted" if r["promoted"] else "kept out"
        print(
            f"{r['group']:>14}  held out {r['held_out']:>2}: {_fmt(r['before'])}  ->  "
            f"{_fmt(r['after'])}  [{verdict}; {r['seconds']} s]"
        )
    (args.work / "results.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
