"""Where a guarded step's time goes: probe, guard, run file, checkpoints, risk, optimizer.

Three models: the demo's 2-layer d64 GPT (batch 8 x 64), a nanoGPT-shaped 2-layer d128
(nanoGPT's shakespeare-char shape: vocabulary 65, 4 heads, 0.4M parameters; batch 12 x
64) and the 6-layer d256 benchmark decoder (batch 16 x 128). For each, a plain loop
(``clip_grad_norm_`` + ``optimizer.step()``) and a guarded one (``guard.step(loss)``:
embedded risk every 10 steps, checkpoints every 100, run file) are stepped in
alternating blocks (ABBA), so that the machine's load drifts hit both alike; the guard's
parts are timed by wrapping its methods (a perf_counter pair each, ~1 us).

Printed per model: the median step of each arm and the overhead (ratio of medians, and
of totals: checkpoints included), then each part's mean microseconds a guarded step
(amortized: a checkpoint every 100 steps counts 1/100 a step) and its share of the plain
step. ``guard (own)`` is guard.step less the parts below it: the norms' reuse, the
decision, the clipping, the host read of the loss and norm, the bookkeeping.

Usage::

    OMP_WAIT_POLICY=passive python benchmarks/step_profile.py               # all three
    OMP_WAIT_POLICY=passive python benchmarks/step_profile.py --models demo --steps 100
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections import defaultdict

import torch

from collapse_guard.datasets.real.model import GPT, GPTConfig
from collapse_guard.guard import Guard, GuardPolicy

__all__ = ["MODELS", "main"]

# name -> (GPTConfig fields, batch size, steps per arm by default)
MODELS = {
    "demo": (dict(vocab_size=256, seq_len=64, n_layer=2, n_head=8, d_model=64), 8, 300),
    "nanogpt": (dict(vocab_size=65, seq_len=64, n_layer=2, n_head=4, d_model=128), 12, 300),
    "6x256": (dict(vocab_size=256, seq_len=128, n_layer=6, n_head=8, d_model=256), 16, 60),
}
_PARTS = (
    ("probe", "probe.after_backward + after_step"),
    ("optimizer", "optimizer.step (the plain loop's too)"),
    ("run file", "run-file appends (parquet chunks)"),
    ("checkpoints", "ring checkpoints, amortized"),
    ("risk", "embedded risk model, every 10 steps"),
    ("guard (own)", "the rest of guard.step"),
)


class Timers:
    """Seconds per part, summed; ``wrap`` times an object's method under a part's name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, obj: object, method: str, part: str) -> None:
        real = getattr(obj, method)

        @functools.wraps(real)
        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - began

        setattr(obj, method, timed)


def _arm(config: GPTConfig):
    torch.manual_seed(0)
    model = GPT(config)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4)


def _instrument(guard: Guard, optimizer, timers: Timers) -> None:
    timers.wrap(guard.probe, "after_backward", "probe")
    timers.wrap(guard.probe, "after_step", "probe")  # (the CPU's sync="step" path)
    timers.wrap(optimizer, "step", "optimizer")
    if guard._writer is not None:
        timers.wrap(guard._writer, "append", "run file")
    timers.wrap(guard, "_checkpoint", "checkpoints")
    if guard.risk is not None:
        timers.wrap(guard.risk, "submit", "risk")


def profile(name: str, steps: int, block: int) -> None:
    fields, batch, _ = MODELS[name]
    config = GPTConfig(**fields)
    plain_model, plain_opt = _arm(config)
    guard_model, guard_opt = _arm(config)
    folder = tempfile.mkdtemp(prefix=f"step-profile-{name}-")
    guard = Guard(
        guard_model, guard_opt, folder, policy=GuardPolicy(checkpoint_every=100), preflight=False
    )
    timers = Timers()
    _instrument(guard, guard_opt, timers)
    generator = torch.Generator().manual_seed(1)
    shape = (batch, config.seq_len + 1)
    batches = [
        torch.randint(0, config.vocab_size, shape, generator=generator) for _ in range(block)
    ]
    times: dict[str, list[float]] = {"plain": [], "guard": []}
    in_guard = [0.0]

    def run(arm: str) -> None:
        model, opt = (plain_model, plain_opt) if arm == "plain" else (guard_model, guard_opt)
        for b in batches:
            began = time.perf_counter()
            _, loss = model(b[:, :-1], b[:, 1:])
            loss.backward()
            if arm == "plain":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
                opt.step()
                loss.item()  # the plain loop reads its loss too (nanoGPT logs it)
            else:
                mark = time.perf_counter()
                guard.step(loss)
                in_guard[0] += time.perf_counter() - mark
            opt.zero_grad(set_to_none=True)
            times[arm].append(time.perf_counter() - began)

    run("plain"), run("guard")  # warm-up: allocator, first checkpoint
    times = {"plain": [], "guard": []}
    timers.seconds.clear()
    in_guard[0] = 0.0
    order = ("plain", "guard", "guard", "plain")
    for i in range(2 * steps // block):
        run(order[i % 4])
    guard.close()
    n = len(times["guard"])
    med = {arm: statistics.median(v) for arm, v in times.items()}
    total = {arm: sum(v) for arm, v in times.items()}
    parts = dict(timers.seconds)
    parts["guard (own)"] = in_guard[0] - sum(parts.values())  # every part is inside it
    plain_step = med["plain"]
    load = os.getloadavg()[0]
    print(
        f"\n## {name}: {sum(p.numel() for p in guard_model.parameters()) / 1e6:.2f}M parameters, "
        f"{len(list(guard_model.parameters()))} tensors, batch {batch}x{config.seq_len}, "
        f"{n} steps per arm in ABBA blocks of {block}, load {load:.1f}"
    )
    print(
        f"plain {plain_step * 1e3:.2f} ms, guarded {med['guard'] * 1e3:.2f} ms (medians): "
        f"overhead {100 * (med['guard'] / plain_step - 1):+.1f} % of medians, "
        f"{100 * (total['guard'] / total['plain'] - 1):+.1f} % of totals "
        f"({guard.checkpoints} checkpoints, {len(guard.risk_readings)} risk readings)"
    )
    print("| part | us / step | % of the plain step | what |\n|---|---|---|---|")
    for part, what in _PARTS:
        us = 1e6 * parts.get(part, 0.0) / n
        print(f"| {part} | {us:,.0f} | {100 * us / 1e6 / plain_step:.2f} | {what} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--steps", type=int, default=0, help="steps per arm (0: the model's)")
    parser.add_argument("--block", type=int, default=10, help="steps per ABBA block")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPUs")
    for name in args.models:
        profile(name, args.steps or MODELS[name][2], args.block)


if __name__ == "__main__":
    main()
