"""QK-clip on healthy runs: does ``GuardPolicy(qk_clip="always")`` change the final loss?

Issue 24: QK-clip must not hurt healthy runs. Method: per seed, two guarded runs of the
same GPT on the same batches, one with ``qk_clip="off"``, one with ``"always"`` (tau =
``--tau``, Kimi K2's 100 by default); reported per seed: the final loss (mean of the
last 20 steps) of each arm, their difference, the heads clipped and the largest
attention logit the probe saw (``attn_logit_max``). The noise the difference is judged
against is the spread of the final loss across seeds of the same arm.

Data: a seeded first-order Markov chain over ``--vocab`` tokens (each token has 4 likely
successors), so the loss has a floor below log(vocab) that training approaches.

``--cost``: QK-clip's own time on the guard's path instead, on one model (the 6-layer
d256 8-head benchmark model by default: ``--layers 6 --width 256 --heads 8 --batch 16
--seq 128``): the plan made at a probe pass from its captures (every
``ProbeConfig.attention_every`` steps; the per-head maxima it reads are the probe's own
``attn_logit_max`` work, in the probe-overhead row), a clip of every head when one is
planned, and one training step (forward, backward, AdamW), each the median of repeats.

Usage::

    OMP_WAIT_POLICY=passive python benchmarks/qk_clip_healthy.py --seeds 3 --steps 300
    OMP_WAIT_POLICY=passive python benchmarks/qk_clip_healthy.py --cost --layers 6 \\
        --width 256 --heads 8 --batch 16 --seq 128
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
import warnings

import torch

from collapse_guard.datasets.real.model import GPT, GPTConfig
from collapse_guard.guard import Guard
from collapse_guard.guard.qk_clip import QKClip
from collapse_guard.probe import ProbeConfig
from collapse_guard.probe.capture import capture_attention, isolated
from collapse_guard.runfiles import read_run

__all__ = ["main"]


def _chain(vocab: int, seed: int) -> torch.Tensor:
    """Transition probabilities: 4 likely successors per token, the rest rare."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, vocab, generator=g)
    top = logits.topk(4, dim=1).indices
    logits.scatter_(1, top, logits.gather(1, top) + 4.0)
    return logits.softmax(dim=1)


def _batches(chain: torch.Tensor, batch: int, seq: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    while True:
        tokens = torch.empty(batch, seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, chain.size(0), (batch,), generator=g)
        for t in range(seq):
            tokens[:, t + 1] = torch.multinomial(chain[tokens[:, t]], 1, generator=g)[:, 0]
        yield tokens[:, :-1], tokens[:, 1:]


def _model(args: argparse.Namespace, seed: int) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=args.vocab,
        seq_len=args.seq,
        n_layer=args.layers,
        n_head=args.heads,
        d_model=args.width,
    )
    return GPT(config)


def _median_ms(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def _cost(args: argparse.Namespace) -> None:
    """QK-clip's time against a training step (module docstring, ``--cost``)."""
    model = _model(args, 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    x, y = next(_batches(_chain(args.vocab, 0), args.batch, args.seq, 0))

    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step_ms = _median_ms(step, args.cost_steps)
    with isolated(model), capture_attention(model) as captures:
        model(x)
    healthy = QKClip(model, args.tau)
    plan_ms = _median_ms(lambda: healthy.plan(captures), 50)
    every_head = QKClip(model, 1e-6)  # every head whose largest logit is positive
    plan = every_head.plan(captures)
    clipped = len(every_head.apply(plan))
    apply_ms = _median_ms(lambda: every_head.apply(plan), 20)
    period = ProbeConfig().attention_every
    print(f"{args.layers} layers, d{args.width}, {args.heads} heads, batch {args.batch}x{args.seq}")
    print(f"training step {step_ms:.1f} ms (median of {args.cost_steps})")
    print(f"plan at a probe pass, no head over tau {args.tau:g}: {plan_ms:.3f} ms")
    print(f"clip of {clipped} heads (every head over tau 1e-6): {apply_ms:.3f} ms")
    share = 100 / period / step_ms  # percent of a step per ms spent at each probe pass
    print(
        f"per step at attention_every {period}: plan {plan_ms * share:.4f} % of a step; "
        f"plan and that clip {(plan_ms + apply_ms) * share:.4f} %"
    )


def _run(args: argparse.Namespace, seed: int, mode: str) -> dict[str, float]:
    model = _model(args, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    policy = {"qk_clip": mode, "qk_clip_tau": args.tau}
    data = _batches(_chain(args.vocab, 0), args.batch, args.seq, seed)
    losses = []
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        guard = Guard(model, optimizer, folder, risk="off", policy=policy, preflight=False)
        for step in range(args.steps):
            for group in optimizer.param_groups:  # linear warmup over the first 10%
                group["lr"] = args.lr * min(1.0, (step + 1) / (0.1 * args.steps))
            x, y = next(data)
            _, loss = model(x, y)
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss))
        guard.close()
        frame, _ = read_run(guard.run_path)
    return {
        "final": statistics.fmean(losses[-20:]),
        "clips": guard.qk_clips,
        "logit_max": float(frame["attn_logit_max"].max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--tau", type=float, default=100.0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--cost", action="store_true", help="QK-clip's time, not final losses")
    parser.add_argument("--cost-steps", type=int, default=5, help="training steps timed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.cost:
        _cost(args)
        return
    print(f"a uniform guess scores log(vocab) = {math.log(args.vocab):.3f} nats")
    print("seed  final off  final always  diff      clips  max attn logit (off / always)")
    finals = {"off": [], "always": []}
    for seed in range(args.seeds):
        off, always = _run(args, seed, "off"), _run(args, seed, "always")
        finals["off"].append(off["final"])
        finals["always"].append(always["final"])
        diff = always["final"] - off["final"]
        print(
            f"{seed:4d}  {off['final']:9.4f}  {always['final']:12.4f}  {diff:+.2e}  "
            f"{always['clips']:5d}  {off['logit_max']:.2f} / {always['logit_max']:.2f}"
        )
    if args.seeds > 1:
        spread = statistics.stdev(finals["off"])
        print(f"seed-to-seed spread of the final loss (off): {spread:.4f} nats")


if __name__ == "__main__":
    main()
