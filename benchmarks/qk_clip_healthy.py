"""QK-clip on healthy runs: does ``GuardPolicy(qk_clip="always")`` change the final loss?

Issue 24: QK-clip must not hurt healthy runs. Method: per seed, two guarded runs of the
same GPT on the same batches, one with ``qk_clip="off"``, one with ``"always"`` (tau =
``--tau``, Kimi K2's 100 by default); reported per seed: the final loss (mean of the
last 20 steps) of each arm, their difference, the heads clipped and the largest
attention logit the probe saw (``attn_logit_max``). The noise the difference is judged
against is the spread of the final loss across seeds of the same arm.

Data: a seeded first-order Markov chain over ``--vocab`` tokens (each token has 4 likely
successors), so the loss has a floor below log(vocab) that training approaches.

Usage::

    OMP_WAIT_POLICY=passive python benchmarks/qk_clip_healthy.py --seeds 3 --steps 300
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import warnings

import torch

from collapse_guard.datasets.real.model import GPT, GPTConfig
from collapse_guard.datasets.runfile import read_run
from collapse_guard.guard import Guard

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


def _run(args: argparse.Namespace, seed: int, mode: str) -> dict[str, float]:
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=args.vocab,
        seq_len=args.seq,
        n_layer=args.layers,
        n_head=args.heads,
        d_model=args.width,
    )
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    policy = {"qk_clip": mode, "qk_clip_tau": args.tau}
    data = _batches(_chain(args.vocab, 0), args.batch, args.seq, seed)
    losses = []
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        guard = Guard(model, optimizer, folder, risk="off", config=policy, preflight=False)
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
    args = parser.parse_args()
    torch.set_num_threads(1)
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
