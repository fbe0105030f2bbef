"""Retrain on guarded runs of a set-up the bundled model never saw: the forecast before and after.

Issue 33's loop, as a user runs it: healthy runs of their own model recorded with
``Probe.record_to``, the bundled model calibrated on them (``calibrate``: champion v1), guarded
runs with that champion (re-warmed too far, so that some collapse and the guard rescues
them; others healthy), then ``retrain`` on the guarded runs (rescues labelled, the rows the
guard left known kept: ``runfiles/censoring.py``) over a base dataset of synthetic runs, with
the training's default settings (a user's ``collapse-guard retrain``). The bundled model, v1,
the challenger and the champion ``retrain`` leaves are then scored on **fresh** runs of the
set-up, unguarded (their label is the truth), at their own stored ``warn`` level, as the
evaluation counts events: recall (collapses warned of 10-200 steps ahead) and false alarms
per 10k healthy steps; and, threshold-free, ROC-AUC over their pre-onset rows (a collapse
within 200 steps or not).

The set-up: :class:`Relu2GPT`, a GPT written here, outside the project's generator (whose
families are gpt, mha, rope_swiglu and drawn: GELU or SwiGLU MLPs, no attention
temperature): a squared-ReLU MLP and a learned per-head attention temperature, AdamW,
char-level on standard-library sources. ``tests/predictor/lifecycle/test_retrain_guarded.py``
runs the same loop on its own model through :func:`train_run`.

Usage::

    OMP_WAIT_POLICY=passive nice -n 5 python benchmarks/guarded_retrain.py --fresh 6
"""

from __future__ import annotations

import argparse
import inspect
import math
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Relu2GPT", "collapsing", "ramp", "seeded", "steady", "text_batches", "train_run"]

VOCAB = 128  # ASCII
SEQ = 32


def text_batches(seed: int, batch: int = 8, seq: int = SEQ) -> Iterator[tuple]:
    """Seeded windows of char-level text: the sources of a few standard-library modules."""
    import difflib
    import json.decoder
    import textwrap

    text = "".join(inspect.getsource(m) for m in (textwrap, difflib, json.decoder))
    data = torch.tensor([min(ord(c), VOCAB - 1) for c in text], dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, data.numel() - seq - 1, (batch,), generator=g)
        rows = torch.stack([data[s : s + seq + 1] for s in start.tolist()])
        yield rows[:, :-1], rows[:, 1:]


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)  # fused q, k, v (nanoGPT's layout)
        self.c_proj = nn.Linear(width, width)
        self.temperature = nn.Parameter(torch.zeros(heads, 1, 1))  # log-scale, per head
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        q = q * self.temperature.exp()
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.relu(self.up(self.ln_2(x))).square())


class Relu2GPT(nn.Module):
    """A small GPT: learned positions, pre-LN blocks with a squared-ReLU MLP and a learned
    attention temperature per head, an untied head; ``forward(x, y) -> (logits, loss)``."""

    def __init__(self, width: int = 48, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, width), nn.Embedding(SEQ, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(width), nn.Linear(width, VOCAB, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):
        h = self.wte(x) + self.wpe(torch.arange(x.size(1)))
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.ln_f(h))
        loss = None if y is None else F.cross_entropy(logits.flatten(0, 1), y.flatten())
        return logits, loss


def steady(lr: float = 2e-3, warmup: int = 30) -> Callable[[int], float]:
    """Linear warmup to ``lr``, then held."""
    return lambda step: lr * min(1.0, (step + 1) / warmup)


def ramp(at: int, over: int, peak: float, lr: float = 2e-3) -> Callable[[int], float]:
    """:func:`steady`, re-warmed from step ``at`` to ``peak`` over ``over`` steps (and held)."""
    base = steady(lr)
    return lambda step: base(step) + (peak - lr) * min(1.0, max(0, step - at) / over)


def collapsing() -> Callable[[int], float]:
    """AdamW at 2e-3 re-warmed to 0.4 from step 300 over 150 steps: these small GPTs collapse
    on the way up (the rescues this script prints), well after the model's first full window
    of 200 steps, so that a forecast can come 10 or more steps ahead."""
    return ramp(at=300, over=150, peak=0.4)


def train_run(
    build: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
    lr_at: Callable[[int], float],
    steps: int,
    out: Path,
    run_id: str,
    *,
    seed: int,
    risk=None,
) -> Path:
    """One run of the user's loop, nanoGPT's way (the LR set every step); returns its run file.

    ``risk`` None: recorded with ``Probe.record_to`` (clipping at 1.0, as the guard's
    default), written to ``out/<run_id>.parquet``; else guarded (``Guard(risk=risk)``),
    its run file in ``out/<run_id>/``."""
    from collapse_guard.guard import Guard, GuardGaveUp
    from collapse_guard.probe import Probe
    from collapse_guard.runfiles import RunMeta

    model, optimizer = build()
    batches = text_batches(seed)
    if risk is None:
        probe = Probe(model, optimizer)
        path = Path(out) / f"{run_id}.parquet"
        probe.record_to(path, RunMeta(run_id=run_id, source="real", config={"seed": seed}))
    else:
        guard = Guard(model, optimizer, Path(out) / run_id, risk=risk, run_id=run_id)
    for step in range(steps):
        while risk is not None and guard.should_skip_batch():
            next(batches)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        _, loss = model(*next(batches))
        loss.backward()
        if risk is None:
            probe.after_backward(loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            probe.after_step()
        else:
            try:
                guard.step(loss)
            except GuardGaveUp:  # closed by the guard itself: the run ends here
                return guard.run_path
        optimizer.zero_grad(set_to_none=True)
    if risk is None:
        probe.close()
        return path
    guard.close()
    return guard.run_path


def seeded(make_model: Callable[[], nn.Module], seed: int):
    """A ``build`` for :func:`train_run`: ``make_model()`` under ``torch.manual_seed(seed)``,
    with AdamW (betas 0.9, 0.95; the LR is the schedule's)."""

    def build():
        torch.manual_seed(seed)
        model = make_model()
        return model, torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95))

    return build


def _runs(kind: str, seeds: range, out: Path, steps: int, risk=None) -> list[Path]:
    schedules = {"healthy": steady(), "ramp": collapsing()}
    return [
        train_run(
            seeded(Relu2GPT, s), schedules[kind], steps, out, f"{kind}-{s}", seed=s, risk=risk
        )
        for s in seeds
    ]


def _labelled(paths: list[Path]) -> list:
    """The fresh runs as records, labelled by the project's rule (recorded runs carry none)."""
    from collapse_guard.runfiles import read_run
    from collapse_guard.runfiles.label import label_unlabelled
    from collapse_guard.runfiles.records import RunRecord

    records = []
    for path in paths:
        frame, meta = read_run(path)
        records.append(RunRecord(frame, label_unlabelled(frame, meta)[0]))
    return records


def _score(model, runs: list) -> str:
    """One table row's figures: recall and false alarms at warn, ROC-AUC over the rows."""
    from collapse_guard.predictor.lifecycle.promotion import rank_on, score_at_warn

    score = score_at_warn(model, runs)
    caught = f"{score.recall:.2f} ({score.caught}/{score.n_collapsed})"
    recall = "-" if math.isnan(score.recall) else caught
    return f"{recall:>15} {score.fa_per_10k:>17.1f} {rank_on(model, runs).roc_auc:>8.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=520, help="per run; >= 450 (the ramp)")
    parser.add_argument("--healthy", type=int, default=4, help="recorded runs to calibrate on")
    parser.add_argument("--guarded", type=int, default=8, help="guarded runs, half re-warmed")
    parser.add_argument("--fresh", type=int, default=6, help="fresh runs of each kind scored")
    parser.add_argument("--base", type=int, default=60, help="synthetic runs in the dataset")
    args = parser.parse_args()
    import os

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs
    from collapse_guard.datasets.synthetic.sampler import SamplerConfig
    from collapse_guard.predictor.core.recalibrate import calibrate
    from collapse_guard.predictor.core.risk import RiskModel
    from collapse_guard.predictor.lifecycle import registry
    from collapse_guard.predictor.lifecycle.retrain import retrain

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # the guard's one-line notices
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root}/mlruns/mlflow.db"
        (root / "mlruns").mkdir()
        short = SamplerConfig(min_steps=600, max_steps=800, sudden_share=0.0, decoy_share=0.3)
        generate_synthetic_runs(args.base, root / "base", seed=11, config=short)
        healthy = _runs("healthy", range(args.healthy), root / "recorded", args.steps)
        registry.log_calibration(calibrate(RiskModel.load(), healthy))  # champion v1
        v1 = RiskModel.load(f"models:/{registry.MODEL_NAME}@{registry.CHAMPION}")
        half = args.guarded // 2
        folder = v1.save(root / "v1")
        seeds = range(100, 100 + half)
        _runs("healthy", seeds, root / "guarded", args.steps, risk=str(folder))
        _runs("ramp", seeds, root / "guarded", args.steps, risk=str(folder))
        result = retrain([str(root / "guarded")], base=root / "base")
        after = RiskModel.load(f"models:/{registry.MODEL_NAME}@{registry.CHAMPION}")
        fresh = range(200, 200 + args.fresh)
        scored = _runs("healthy", fresh, root / "fresh", args.steps)
        scored = _labelled(scored + _runs("ramp", fresh, root / "fresh", args.steps))
        kept = {i.run_id: i.censoring for i in result.ingest.ingested}
        rows = sum(c.rows_kept for c in kept.values() if c is not None)
        rescues = sorted(c.rescue for c in kept.values() if c is not None and c.rescue)
        print(f"retrain: v{result.version} {'promoted' if result.promoted else 'kept out'}")
        print(f"  {result.reason}")
        print(f"  guarded runs ingested: {len(kept)}, rows kept {rows}, rescues at {rescues}")
        print(f"\n{'model':<34} {'recall at warn':>15} {'FA / 10k healthy':>17} {'ROC-AUC':>8}")
        challenger = RiskModel.load(f"models:/{registry.MODEL_NAME}/{result.version}")
        models = (
            ("bundled, as shipped", RiskModel.load()),
            ("before: v1, bundled calibrated", v1),
            (f"challenger v{result.version}", challenger),
            (f"after: champion v{registry.champion_version()}", after),
        )
        for name, model in models:
            print(f"{name:<34} {_score(model, scored)}")


if __name__ == "__main__":
    main()
