"""The guard on a model under ``torch.compile``: recompiles and step time, guarded and not.

The probe's passes (every 10 steps: eval mode, no grad, hooks on every module) used to run
through the compiled forward; each failed a guard of the training graph and recompiled it,
and after dynamo's recompile limit (8) the user's training forward ran eager for the rest of
the run. They now run eagerly (``probe.capture.isolated``). Arms, each a fresh model and
compile, the same seed and batches: ``plain`` (compiled, ``clip_grad_norm_`` +
``optimizer.step()``), ``guarded`` (compiled, ``guard.step``), ``passes_compiled`` (the
guard with its passes sent through the compiled forward again: the old behaviour), and
``eager`` (the plain loop uncompiled, for scale). Reported per arm: the frames dynamo
compiled (``counters["frames"]["ok"]``; over the limit, dynamo runs the forward eager from
then on), and the median step over the last half of the steps (after every compile).

Usage::

    OMP_WAIT_POLICY=passive python benchmarks/compiled_guard.py --steps 200
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
import warnings

import torch

from collapse_guard.datasets.real.model import GPT, GPTConfig
from collapse_guard.guard import Guard
from collapse_guard.probe import capture

__all__ = ["main"]

ARMS = ("eager", "plain", "guarded", "passes_compiled")


def _arm(arm: str, config: GPTConfig, steps: int, backend: str) -> dict:
    import torch._dynamo as dynamo

    dynamo.reset()
    dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    compiled = model if arm == "eager" else torch.compile(model, backend=backend)
    batches = torch.Generator().manual_seed(1)
    times, folder = [], tempfile.TemporaryDirectory()
    plain = arm in ("eager", "plain")
    guard = None if plain else Guard(compiled, optimizer, folder.name, record=False)
    eager = capture._eager
    if arm == "passes_compiled":
        capture._eager = contextlib.nullcontext  # the probe's passes through the graph
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(steps):
                tokens = torch.randint(0, 256, (16, config.seq_len + 1), generator=batches)
                started = time.perf_counter()
                _, loss = compiled(tokens[:, :-1], tokens[:, 1:])
                loss.backward()
                if guard is None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                else:
                    guard.step(loss)
                optimizer.zero_grad(set_to_none=True)
                times.append(time.perf_counter() - started)
    finally:
        capture._eager = eager
        if guard is not None:
            guard.close()
        folder.cleanup()
    frames = int(dynamo.utils.counters["frames"]["ok"])
    return {
        "frames": frames,
        "limit": frames > dynamo.config.recompile_limit,
        "median_ms": 1e3 * statistics.median(times[steps // 2 :]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = GPTConfig(
        vocab_size=256, seq_len=args.seq, n_layer=args.layers, n_head=4, d_model=args.width
    )
    rows = {arm: _arm(arm, config, args.steps, args.backend) for arm in ARMS}
    print(f"{args.layers}x{args.width}, seq {args.seq}, {args.steps} steps, {args.backend}")
    print("| arm | frames compiled | recompile limit hit | median step (ms, last half) |")
    print("|---|---:|---|---:|")
    for arm, row in rows.items():
        print(f"| {arm} | {row['frames']} | {row['limit']} | {row['median_ms']:.1f} |")
    base = rows["plain"]["median_ms"]
    print(f"\nguarded / plain {rows['guarded']['median_ms'] / base:.3f}; passes compiled / "
          f"plain {rows['passes_compiled']['median_ms'] / base:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
