"""Probe overhead: step time of a 6-layer transformer with and without the probe.

Issue 2's target: on a 6-layer, d_model 256, 8-head decoder (``GPT`` of
``collapse_guard.datasets.real.model``, seq_len 128), CPU, batch 16 x 128 tokens,
AdamW, the probe at its default periods costs at most 3% of step time.

Method: two identical models (same seed), one with a probe, trained in the same
process in alternating blocks of ``--block`` steps (ABBA order), so that machine load
drifts hit both arms alike. The probe keeps its step counter across its blocks; its
periodic work (attention every 50 steps, system every 100) rarely falls in a short
window, so a few steps forced onto a multiple of 100 are timed separately.
Reported: the median step time of each arm and their ratio (end to end; on a busy
machine this carries the load's noise), the time spent inside the probe's two calls
per step (its every-step cost, measured directly), the extra time of a step where the
periodic families are due, and the overhead at default periods: every-step cost plus
a due step's extra / P, over the median step without the probe, for each attention
period P in ``--attention-every`` (an upper bound: the due step includes the system read,
which comes every 100 steps whatever P is). The opt-in groups (the optimizer state, at its
due step and the step before it; the line group, three probe-batch forwards at its due
step) are timed apart: the time two probes that differ only in the group spend in their
calls over those steps, amortised over each period in ``--opt-in-every``.

Usage::

    OMP_WAIT_POLICY=passive python benchmarks/probe_overhead.py --steps 40 --block 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from collapse_guard.datasets.real.model import GPT, GPTConfig
from collapse_guard.probe import Probe, ProbeConfig
from collapse_guard.probe.config import RECORDED_LINE_EVERY, RECORDED_OPTIMIZER_EVERY

__all__ = ["OPT_IN", "main"]

# the groups off by default and on where runs are recorded as data: their periods there
OPT_IN = {"optimizer_every": RECORDED_OPTIMIZER_EVERY, "line_every": RECORDED_LINE_EVERY}


def _arm(seed: int, device: str) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=6, d_model=256, n_head=8, seq_len=128)).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4)


def _step(model, optimizer, x, y, probe=None) -> tuple[float, float]:
    """One training step; returns (step seconds, of which in the probe's calls)."""
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)  # time work, not queueing
    start = time.perf_counter()
    _, loss = model(x, y)
    loss.backward()
    in_probe = 0.0
    if probe is not None:
        sync()
        mark = time.perf_counter()
        probe.after_backward(loss)
        sync()
        in_probe += time.perf_counter() - mark
    optimizer.step()
    if probe is not None:
        sync()
        mark = time.perf_counter()
        probe.after_step()  # returns floats: includes the probe's one host sync
        in_probe += time.perf_counter() - mark
    optimizer.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - start, in_probe


def _timed(call, sync) -> float:
    sync()
    mark = time.perf_counter()
    call()
    sync()
    return time.perf_counter() - mark


def _opt_in_cost(model, optimizer, batch, field: str, period: int, repeats: int = 6) -> float:
    """Seconds an opt-in group (``field``: its period's config field) adds to the probe's
    calls over its due step and the ``lead`` steps before it.

    Two probes on the one model, alike but for ``field`` (``period``, and 0), are both
    called at every step, first one then the other, in alternating order (the first after
    the backward meets cold caches); the every-step groups are on in both, so the optimizer
    group's parameter sketch is the update group's as at the defaults. The attention and
    system groups are off: they would fall on the due step too.
    """
    quiet = {"attention_every": 0, "system_every": 0}
    arms = [Probe(model, optimizer, ProbeConfig(**quiet, **{field: p})) for p in (period, 0)]
    lead = next(g for g in arms[0].groups if g.period_field == field).lead
    sync = torch.cuda.synchronize if next(model.parameters()).is_cuda else (lambda: None)
    extra = []
    for k in range(1, repeats + 1):
        spent = [0.0, 0.0]
        order = (0, 1) if k % 2 else (1, 0)
        for probe in arms:
            probe.step = period * k - lead  # the lead steps, then the due step
        for _ in range(lead + 1):
            x, y = batch()
            _, loss = model(x, y)
            loss.backward()
            for i in order:
                spent[i] += _timed(lambda i=i, loss=loss: arms[i].after_backward(loss), sync)
            optimizer.step()
            for i in order:
                spent[i] += _timed(arms[i].after_step, sync)
            optimizer.zero_grad(set_to_none=True)
        extra.append(spent[0] - spent[1])
    for probe in arms:
        probe.close()
    return statistics.median(extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="measured steps per arm")
    parser.add_argument("--block", type=int, default=10, help="steps per alternating block")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps per arm")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--batch", type=int, default=16, help="sequences per batch")
    parser.add_argument("--device", default="cpu", help="cpu (the target) or cuda")
    parser.add_argument(
        "--attention-every",
        default="10,25,50",
        help="attention periods to report the amortised overhead for (comma-separated)",
    )
    parser.add_argument(
        "--opt-in-every",
        default="5,10,25,50",
        help="periods to report the amortised cost of each opt-in group (optimizer, line) for",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    plain_model, plain_opt = _arm(0, args.device)
    probed_model, probed_opt = _arm(0, args.device)
    probe = Probe(probed_model, probed_opt)
    generator = torch.Generator().manual_seed(1)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, 256, (args.batch, 129), generator=generator).to(args.device)
        return tokens[:, :-1], tokens[:, 1:]

    for _ in range(args.warmup):
        _step(plain_model, plain_opt, *batch())
        _step(probed_model, probed_opt, *batch(), probe=probe)
    times: dict[str, list[float]] = {"without": [], "with": []}
    in_probe: list[float] = []
    done = 0
    while done < args.steps:
        n = min(args.block, args.steps - done)
        # ABBA order: neither arm always runs right after the other
        order = ("without", "with") if (done // args.block) % 2 == 0 else ("with", "without")
        for arm in order:
            for _ in range(n):
                x, y = batch()
                if arm == "with":
                    total, own = _step(probed_model, probed_opt, x, y, probe)
                    in_probe.append(own)
                else:
                    total, _ = _step(plain_model, plain_opt, x, y)
                times[arm].append(total)
        done += n
        print(f"  {done}/{args.steps} steps per arm", flush=True)

    # The periodic work (probe-batch pass every 50 steps, system every 100) rarely falls
    # in a short window: time a few steps forced onto a multiple of 100 (all families due).
    periodic = []
    for _ in range(3):
        probe.step = 100 * (probe.step // 100 + 1)
        periodic.append(_step(probed_model, probed_opt, *batch(), probe=probe)[1])

    opt_in = {
        field: _opt_in_cost(probed_model, probed_opt, batch, field, period)
        for field, period in OPT_IN.items()
    }

    median = {arm: statistics.median(t) for arm, t in times.items()}
    base = median["without"]
    every_step = statistics.median(in_probe)
    extra = statistics.median(periodic) - every_step  # attention + outputs + system
    periods = [int(p) for p in args.attention_every.split(",")]
    print(
        f"GPT 6x256, 8 heads, batch {args.batch}x128, AdamW, {args.device}, "
        f"{args.threads} thread(s), {args.steps} steps per arm in blocks of {args.block}"
    )
    for arm in ("without", "with"):
        print(f"  {arm:>7} probe: median {median[arm] * 1e3:8.1f} ms/step")
    print(f"  end to end (median with / median without - 1): {median['with'] / base - 1:+.2%}")
    print(f"  probe calls, every step: {every_step * 1e3:.1f} ms = {every_step / base:.2%}")
    print(f"  probe calls, due step (probe pass + system): {extra * 1e3:.1f} ms more")
    default = ProbeConfig().attention_every
    for period in periods:
        # an upper bound: the system read (every 100 steps) is in ``extra`` too
        amortized = every_step + extra / period
        mark = " (default)" if period == default else ""
        print(f"  overhead, attention every {period:>3} steps{mark}: {amortized / base:.2%}")
    for field, spent in opt_in.items():
        group = field.removesuffix("_every")
        print(
            f"  {group} group, its due step (and lead): {spent * 1e3:.2f} ms in the probe's calls"
        )
        for period in (int(p) for p in args.opt_in_every.split(",")):
            mark = " (recorded runs)" if period == OPT_IN[field] else ""
            print(f"  {group} group, every {period:>3} steps{mark}: {spent / period / base:.3%}")


if __name__ == "__main__":
    main()
