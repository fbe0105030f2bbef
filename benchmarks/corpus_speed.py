"""How fast the corpus grows, where a real run's time goes, and what batching could give.

    python benchmarks/corpus_speed.py [--runs 6] [--steps 300] [--split 4] [--models 6] [--sizes 10]

Four measurements, side by side in one process tree, on whatever load the machine has
(printed: the load average before and after):

1. **generation**: the seed-0 sweep's first ``--runs`` configs (``--steps`` steps each)
   through ``generate_real_runs`` on 2 workers, as ``collapse-guard data real`` makes
   them: runs per minute.
2. **a step's time**: for the sweep's first configs, one training step without the probe,
   with it, and without it at batch 1 (what is not arithmetic: the most that batching
   several models into one process could ever take off).
3. **batching**: of each family, the sweep's largest group of same-shape fp32 configs
   (its first 400 runs have 264 shapes; 72 runs are in groups of 4 or more), up to
   ``--models`` of them trained one after another against one ``torch.func.vmap``
   forward and backward over their stacked parameters: the best of 3 alternating tries.
4. **sizes** (``--sizes N``): bytes per run of N corpus runs rewritten as float64 files
   and as compact ones (``write_run(compact=True)``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before torch: docs/stack.md
os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread a run, as the pool's workers

import torch

from collapse_guard.datasets.real import generate_real_runs, sample_configs
from collapse_guard.datasets.real.runner import build, train
from collapse_guard.probe import Probe
from collapse_guard.runfiles import list_runs, read_meta, read_run, write_run

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "real"


class _NoProbe:
    def after_backward(self, loss) -> None:
        pass

    def after_step(self) -> None:
        pass


def _ms_per_step(config, probe: bool) -> float:
    model, optimizer = build(config)
    watcher = Probe(model, optimizer) if probe else _NoProbe()
    began = time.perf_counter()
    train(config, model, optimizer, watcher)
    return (time.perf_counter() - began) / config.steps * 1e3


def generation(runs: int, steps: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        paths = generate_real_runs(runs, Path(folder), workers=2, steps=steps, progress=False)
        minutes = (time.perf_counter() - began) / 60
        seconds = sorted(read_meta(path).extra["seconds"] for path in paths)
    print(
        f"generation: {runs} runs of {steps} steps on 2 workers in {minutes * 60:.0f} s: "
        f"{runs / minutes:.2f} runs/min ({seconds[len(seconds) // 2]:.1f} s a run, median)"
    )


def step_split(count: int, steps: int) -> None:
    print("a step (ms): config | no probe | probe | no probe at batch 1")
    for config in sample_configs(count, seed=0, steps=steps):
        bare, probed = _ms_per_step(config, False), _ms_per_step(config, True)
        config.batch_size = 1
        floor = _ms_per_step(config, False)
        size = f"{config.n_layer}x{config.d_model}"
        name = f"{config.family} {config.optimizer} {size} {config.precision}"
        print(f"  {name:34s} {bare:6.1f} {probed:6.1f} {floor:6.1f} ({floor / bare:.0%})")


def _shape(config) -> tuple:
    fields = (
        "family",
        "n_layer",
        "d_model",
        "n_head",
        "seq_len",
        "batch_size",
        "vocab_size",
        "qk_norm",
        "pre_ln",
        "block",
        "norm",
        "positions",
        "mlp",
        "tied",
    )
    return tuple(getattr(config, name) for name in fields)


def batching(models: int) -> None:
    """The largest same-shape fp32 group of each family, one by one against vmap."""
    configs = [c for c in sample_configs(400, seed=0) if c.precision == "fp32"]
    for family in sorted({c.family for c in configs}):
        shapes = Counter(_shape(c) for c in configs if c.family == family)
        shape, _ = shapes.most_common(1)[0]
        _batch_group([c for c in configs if _shape(c) == shape][:models])


def _batch_group(group: list, repeats: int = 3, steps: int = 10) -> None:
    from torch.func import functional_call, vmap

    nets = [build(config)[0] for config in group]
    config = group[0]
    tokens = torch.randint(0, config.vocab_size, (len(nets), config.batch_size, config.seq_len))
    names = [name for name, _ in nets[0].named_parameters()]

    def one_by_one() -> None:
        for net, x in zip(nets, tokens, strict=True):
            net(x, x)[1].backward()

    def loss(params, x):
        return functional_call(nets[0], params, (x, x))[1]

    def batched() -> None:
        weights = [dict(net.named_parameters()) for net in nets]
        stacked = {name: torch.stack([w[name] for w in weights]) for name in names}
        vmap(loss)(stacked, tokens).sum().backward()

    best = {one_by_one: float("inf"), batched: float("inf")}
    for _ in range(repeats):
        for fn in best:
            fn()  # warm
            began = time.perf_counter()
            for _ in range(steps):
                fn()
            best[fn] = min(best[fn], (time.perf_counter() - began) / steps * 1e3)
    print(
        f"batching {len(nets)} same-shape models ({config.family} {config.n_layer}x"
        f"{config.d_model}, batch {config.batch_size}x{config.seq_len}), forward+backward: "
        f"one by one {best[one_by_one]:.1f} ms, vmap {best[batched]:.1f} ms "
        f"({best[one_by_one] / best[batched]:.2f}x)"
    )


def sizes(count: int) -> None:
    paths = list_runs(CORPUS)[:count]
    totals = Counter()
    with tempfile.TemporaryDirectory() as folder:
        for path in paths:
            frame, meta = read_run(path)
            for compact in (False, True):
                out = write_run(Path(folder) / f"{compact}.parquet", frame, meta, compact=compact)
                totals[compact] += out.stat().st_size
    wide, narrow = totals[False] / len(paths) / 1e3, totals[True] / len(paths) / 1e3
    print(
        f"sizes, {len(paths)} corpus runs: float64 {wide:.1f} KB a run, compact {narrow:.1f} "
        f"KB a run ({narrow / wide:.0%})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="runs to generate (0: skip)")
    parser.add_argument("--steps", type=int, default=300, help="steps per generated run")
    parser.add_argument("--split", type=int, default=4, help="configs whose step is split")
    parser.add_argument("--models", type=int, default=6, help="models batched together")
    parser.add_argument("--sizes", type=int, default=10, help="corpus runs sized (0: skip)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("load average before: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
    if args.sizes:
        sizes(args.sizes)
    if args.runs:
        generation(args.runs, args.steps)
    if args.split:
        step_split(args.split, steps=60)
    if args.models:
        batching(args.models)
    print("load average after: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
