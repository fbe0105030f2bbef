"""The line group on the training batch: corpus runs with an LR rise, trained again.

Issue 34 item 4 asks for a stability margin from a second forward on the same batch where
the consecutive-batch estimate is too noisy. The probe's line group reads the loss along
the step just taken on its probe batch (two sequences) by default; this reruns runs of the
corpus pack with it on the step's **training batch** instead (``runner.run_real``'s
``loss_closure``: a closure over the last training forward's inputs), so that the
first-order term ``g . u`` and the curvature term come from one batch: the line search
critical sharpness does (arXiv 2601.16979). Picked: runs of the pack whose recipe holds an LR rise
(``RISE_RECIPES``) and no injected fault, ``--per-cell`` healthy runs and as many whose
collapse develops for each optimizer (seeded draw), trained in that order, resumable
(a finished file is skipped). The same configuration trains to another trajectory than its
twin in the pack where the CPU differs, so each run is labelled again.

Then, on the folder written::

    python benchmarks/predictor_eval.py --runs OUT --separability --add-groups line
    python benchmarks/predictor_eval.py --runs MIXED --add-groups line [--leave-one-out optimizer]

(``MIXED``: links to the pack's runs without the twins of OUT's, and OUT's). Usage::

    OMP_WAIT_POLICY=passive python benchmarks/line_pilot.py --out OUT [--per-cell 12] [--reverse]

``--reverse`` trains the same list from its end: a second process on the other core.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

from collapse_guard.datasets.real import runner
from collapse_guard.datasets.real.config import RealRunConfig

__all__ = ["RISE_RECIPES", "main", "pick_runs", "training_batch_loss"]

RISE_RECIPES = frozenset({"slow_ramp", "safe_ramp", "constant_high", "nanogpt", "safe_high_lr"})
PACK = ("corpus/breadth", "corpus/real")


def pick_runs(per_cell: int, seed: int = 0) -> list[tuple[str, dict]]:
    """``(file stem, config)`` of the pack's runs to train again, in training order."""
    cells: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    for folder in PACK:
        for path in sorted(Path(folder).glob("*.parquet")):
            meta = json.loads(pq.read_schema(path).metadata[b"collapse_guard"])
            config = meta["config"]
            if config.get("recipe") not in RISE_RECIPES or config.get("fault") != "none":
                continue
            outcome = "healthy" if meta["onset_step"] is None else meta["extra"]["onset_kind"]
            if outcome in ("healthy", "develops"):
                cells.setdefault((config["optimizer"], outcome), []).append((path.stem, config))
    draw = random.Random(seed)
    picked = []
    for cell in sorted(cells):
        runs = cells[cell]
        draw.shuffle(runs)
        picked += runs[:per_cell]
    draw.shuffle(picked)
    return picked


def training_batch_loss(model):
    """A closure over the loss of ``model``'s last training forward's inputs (a forward
    pre-hook keeps them): what ``runner.run_real(loss_closure=)`` takes."""
    last: dict = {}

    def keep(_module, args, kwargs) -> None:
        last.update(args=args, kwargs=kwargs)

    model.register_forward_pre_hook(keep, with_kwargs=True)
    return lambda: model(*last["args"], **last["kwargs"])[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-cell", type=int, default=12)
    parser.add_argument("--reverse", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    picked = pick_runs(args.per_cell)
    for stem, config in reversed(picked) if args.reverse else picked:
        path = args.out / f"{stem}.parquet"
        if path.exists() or runner.temp_path(path).exists():
            continue
        began = time.perf_counter()
        result = runner.run_real(
            RealRunConfig.from_dict(config), path, f"line-{stem}", loss_closure=training_batch_loss
        )
        seconds = time.perf_counter() - began
        print(stem, config["optimizer"], config["recipe"], result.onset_step, f"{seconds:.0f} s")


if __name__ == "__main__":
    main()
