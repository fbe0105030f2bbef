"""Guard overhead on a healthy run: step time with the guard against a plain loop.

Issue 10's target: the guard (its probe, the reactive path, the embedded risk model every
10 steps, the healthy-checkpoint ring and the run file) costs at most 5% of step time,
checkpoints included.

Method: two identical models (same seed, same batches), one trained by a plain loop
(``clip_grad_norm_`` + ``optimizer.step()``), the other by ``guard.step(loss)``, in
alternating blocks of ``--block`` steps in ABBA order, so that drifts of the machine's
load hit both arms alike. Every step is timed from the forward to the end of the step.
Checkpoints come every ``--checkpoint-every`` steps (default 50: twice as often as the
guard's default of 100, so the figure is an upper bound). Reported: each arm's total
and median step time, the ratio of the totals (the headline, checkpoints included),
and the guard's checkpoint count.

Usage::

    OMP_WAIT_POLICY=passive python benchmarks/guard_overhead.py --steps 120 --block 10
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import torch

from collapse_guard.datasets.real.model import GPT, GPTConfig
from collapse_guard.guard import Guard, GuardPolicy

__all__ = ["main"]


def _arm(seed: int, config: GPTConfig) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GPT(config)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120, help="steps per arm")
    parser.add_argument("--block", type=int, default=10, help="steps per ABBA block")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = GPTConfig(
        vocab_size=256, seq_len=args.seq, n_layer=args.layers, n_head=8, d_model=args.width
    )
    plain_model, plain_opt = _arm(0, config)
    guard_model, guard_opt = _arm(0, config)
    policy = GuardPolicy(checkpoint_every=args.checkpoint_every)
    folder = tempfile.mkdtemp(prefix="guard-overhead-")
    warnings.simplefilter("ignore")  # preflight: no warmup in a timing loop, on purpose
    guard = Guard(guard_model, guard_opt, folder, policy=policy)
    generator = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, 256, (args.batch, args.seq + 1), generator=generator)
        for _ in range(args.block)
    ]
    times: dict[str, list[float]] = {"plain": [], "guard": []}

    def block(arm: str) -> None:
        model, opt = (plain_model, plain_opt) if arm == "plain" else (guard_model, guard_opt)
        for batch in batches:
            began = time.perf_counter()
            _, loss = model(batch[:, :-1], batch[:, 1:])
            loss.backward()
            if arm == "plain":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                loss.item()  # the plain loop logs its loss too (nanoGPT does)
            else:
                guard.step(loss)
            opt.zero_grad(set_to_none=True)
            times[arm].append(time.perf_counter() - began)

    order = ("plain", "guard", "guard", "plain")
    for i in range(2 * args.steps // args.block):
        block(order[i % 4])
    guard.close()
    plain, guarded = sum(times["plain"]), sum(times["guard"])
    medians = {arm: statistics.median(values) for arm, values in times.items()}
    print(
        f"model {args.layers}x{args.width}, batch {args.batch}x{args.seq}, "
        f"{len(times['plain'])} steps per arm in blocks of {args.block} (ABBA), "
        f"{args.threads} thread(s)"
    )
    for arm in ("plain", "guard"):
        print(f"{arm:>6}: total {sum(times[arm]):.2f} s, median step {medians[arm] * 1e3:.1f} ms")
    print(
        f"guard overhead, totals: {100 * (guarded / plain - 1):+.2f} % "
        f"({guard.checkpoints} checkpoints, {len(guard.risk_readings)} risk readings); "
        f"medians: {100 * (medians['guard'] / medians['plain'] - 1):+.2f} %"
    )


if __name__ == "__main__":
    main()
