"""The guard in a loop written apart from the project (issue 32's outside check, done here).

Every other rescue benchmark trains the project's own GPT through ``demo.run_scenario``.
This one trains a GPT written in this file (its own attention, pre- or post-LN blocks,
learned or no positions, tied or untied head, PyTorch's default initialisation) on a
language generated here (an order-2 Markov chain over 64 tokens: half the next token's
distribution set by the last token, half by the last two), in the plain loop a user writes:
the LR set on the optimizer's groups every step, ``clip_grad_norm_`` and ``optimizer.step()``
unguarded; ``Guard(model, optimizer, checkpoint_dir=...)``, ``guard.batches`` and
``guard.step(loss)`` guarded, with the bundled model and the default policy: the public API
and nothing else. Optimizers: AdamW, SGD with momentum, Lion (the project's, as a user
would bring one from a package), torch's Muon on the hidden matrices chained with AdamW on
the rest (``ChainedOptimizer``). Six rounds of 18 set-ups (``Setup.round``), each made
after the one before had been read, each later set-up its own seed: the second slow ramps,
step changes of the LR, no clipping, beta2 0.999, wider and deeper models; the third torch's
``LambdaLR`` and ``OneCycleLR`` stepped after ``guard.step``, gradient accumulation, RMSNorm
with SwiGLU, 8 layers; the fourth these mixed; the fifth torch's other optimizers (Adam with
L2 decay, RAdam, NAdam, RMSprop, Adagrad, Adafactor, Nesterov SGD), bf16 autocast, fp16
autocast with a ``GradScaler`` (``Guard(..., scaler=)``), ``CosineAnnealingWarmRestarts``,
dropout; the sixth the loop's habits: nanoGPT's two parameter groups, a group at its own LR
scale, an evaluation forward every few steps, activation checkpointing, a frozen embedding,
the loop's own ``clip_grad_norm_`` kept before ``guard.step``. The second and third rounds'
misses chose ``GuardPolicy.rewind_loss_gap`` (docs/decisions.md 26); the later ones came
after it.

Each set-up is trained by three arms on the same batches: ``unguarded``, ``guarded``, and
``safe`` (unguarded at the set-up's safe peak LR: what the run learns when it is not pushed
past its edge). A collapse is the project's label (``label_run``) on the unguarded run's
losses; a collapse is *saved* when the guarded run has no onset and ends within 0.05 nats of
the safe run (issue 32's bar; the final loss is the mean of the last 50 losses). On the
set-ups that do not collapse the guarded run is compared with the unguarded one.

Usage (about 12 minutes a round on 2 cores; results appended to ``--out`` and read back,
so a rerun skips what is done; ``--setups`` picks some)::

    OMP_WAIT_POLICY=passive python benchmarks/outside_loop.py --out outside.jsonl
    python benchmarks/outside_loop.py --out outside.jsonl --report-only
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ARMS", "SETUPS", "Setup", "main", "train"]

VOCAB, SEQ, BATCH = 64, 64, 16
FINAL_STEPS = 50
ARMS = ("unguarded", "guarded", "safe")


@dataclass(frozen=True)
class Setup:
    """One set-up: model, optimizer and LR schedule (peak ``lr``; ``safe_lr`` for ``safe``)."""

    name: str
    optimizer: str
    lr: float
    safe_lr: float
    warmup: int = 100
    layers: int = 2
    width: int = 64
    heads: int = 4
    post_ln: bool = False
    positions: bool = True
    tied: bool = False
    steps: int = 600
    schedule: str = "cosine"  # cosine to 0.1x | constant | ramp (geometric) | rewarm (linear)
    # | jump (``base`` to the peak at ``rise_from``); optimizers: adamw, sgd, lion, muon, and
    # torch's own adam (L2 decay), radam, nadam, rmsprop, adagrad, adafactor, nesterov (SGD)
    rise_from: int = 250  # ramp / rewarm: the rise from ``base`` to the peak
    rise_to: int = 450
    base: float = 0.0
    clip: float = 1.0
    seed: int = 0
    beta2: float = 0.95
    scheduler: str = "manual"  # the LR set on the groups by the loop | lambda (torch's
    # LambdaLR over the same schedule) | onecycle (torch's OneCycleLR, its own schedule)
    # | restarts (torch's CosineAnnealingWarmRestarts from the peak, no warmup)
    accumulate: int = 1  # micro-batches a step (the loss each divided by this)
    rms: bool = False  # RMSNorm and a SwiGLU MLP (else LayerNorm and GELU)
    amp: str = ""  # "bf16": the forward under CPU autocast; "fp16": autocast and a GradScaler
    dropout: float = 0.0  # after attention and the MLP, as nanoGPT's blocks have it
    groups: str = ""  # "decay": nanoGPT's two groups (matrices decayed, the rest not);
    # "scaled": the embedding and head in a group of their own at 0.1x the LR ("lr_scale")
    evaluate: int = 0  # every this many steps an evaluation forward (eval mode, no_grad)
    checkpointing: bool = False  # each block under torch.utils.checkpoint
    frozen: bool = False  # the token embedding not trained (requires_grad False)
    user_clip: bool = False  # the loop clips before guard.step too (the guard then sees
    # clipped gradients: a user who kept the line the guard replaces)
    round: int = 1  # the set-ups' round: each made after the one before had been read


SETUPS: dict[str, Setup] = {
    s.name: s
    for s in (
        Setup("adamw_hot", "adamw", 3e-2, 3e-3),
        Setup("adamw_hot_post", "adamw", 2e-2, 2e-3, post_ln=True),
        Setup("adamw_ramp1000", "adamw", 1.0, 1e-3, schedule="ramp", base=1e-3, warmup=40),
        Setup("adamw_rewarm", "adamw", 6e-2, 3e-3, schedule="rewarm", base=2e-3,
              rise_from=300, rise_to=400),
        Setup("adamw_rewarm_hi", "adamw", 0.3, 3e-3, schedule="rewarm", base=3e-3,
              rise_from=300, rise_to=400),
        Setup("adamw_deep_const", "adamw", 2e-2, 2e-3, layers=4, schedule="constant",
              warmup=200),
        Setup("adamw_x10_cos", "adamw", 0.1, 3e-3, warmup=50, layers=3),
        Setup("adamw_x15", "adamw", 0.15, 3e-3, warmup=150, schedule="constant"),
        Setup("adamw_x30_post", "adamw", 0.3, 3e-3, warmup=200, post_ln=True),
        Setup("adamw_ok", "adamw", 3e-3, 3e-3),
        Setup("lion_hot", "lion", 1e-2, 3e-4),
        Setup("lion_hot_tied", "lion", 5e-3, 3e-4, tied=True, positions=False),
        Setup("lion_x3_tied", "lion", 0.03, 3e-4, tied=True, positions=False),
        Setup("lion_x5", "lion", 0.05, 3e-4, warmup=150, schedule="constant"),
        Setup("sgd_hot", "sgd", 3.0, 0.3, warmup=150),
        Setup("sgd_noclip", "sgd", 2.0, 0.3, warmup=150, clip=0.0),
        Setup("muon_hot", "muon", 0.5, 0.02, warmup=150),
        Setup("muon_rewarm", "muon", 0.5, 0.02, schedule="rewarm", base=0.02),
        Setup("adamw_slow_ramp", "adamw", 0.1, 2e-3, schedule="ramp", base=2e-3, layers=3,
              width=96, steps=1000, rise_from=200, rise_to=900, seed=1, round=2),
        Setup("adamw_noclip", "adamw", 3e-2, 3e-3, clip=0.0, seed=2, round=2),
        Setup("adamw_b2_999", "adamw", 2e-2, 2e-3, beta2=0.999, schedule="constant", seed=3,
              round=2),
        Setup("adamw_jump", "adamw", 0.1, 3e-3, schedule="jump", base=3e-3, rise_from=300,
              seed=4, round=2),
        Setup("adamw_wide", "adamw", 2e-2, 2e-3, layers=4, width=128, heads=8, seed=5, round=2),
        Setup("adamw_post_short", "adamw", 1e-2, 1e-3, post_ln=True, warmup=10, seed=6, round=2),
        Setup("adamw_tied_hot", "adamw", 3e-2, 3e-3, tied=True, positions=False, seed=7, round=2),
        Setup("adamw_deep_rewarm", "adamw", 5e-2, 2e-3, layers=6, schedule="rewarm",
              base=2e-3, rise_from=300, rise_to=500, steps=800, seed=8, round=2),
        Setup("adamw_post_rewarm", "adamw", 5e-2, 2e-3, post_ln=True, schedule="rewarm",
              base=2e-3, seed=9, round=2),
        Setup("adamw_long_ramp", "adamw", 0.3, 1e-3, schedule="ramp", base=1e-3, steps=1000,
              rise_from=300, rise_to=900, seed=10, round=2),
        Setup("lion_rewarm", "lion", 1e-2, 3e-4, schedule="rewarm", base=3e-4, seed=11, round=2),
        Setup("lion_ramp", "lion", 0.1, 1e-4, schedule="ramp", base=1e-4, seed=12, round=2),
        Setup("sgd_ramp", "sgd", 10.0, 0.1, schedule="ramp", base=0.1, seed=13, round=2),
        Setup("sgd_noclip_hot", "sgd", 4.0, 0.3, clip=0.0, warmup=50, seed=14, round=2),
        Setup("sgd_jump", "sgd", 5.0, 0.3, schedule="jump", base=0.3, rise_from=300, seed=15,
              round=2),
        Setup("muon_ramp", "muon", 2.0, 0.02, schedule="ramp", base=0.02, seed=16, round=2),
        Setup("muon_const", "muon", 0.3, 0.02, schedule="constant", warmup=50, seed=17, round=2),
        Setup("muon_wide", "muon", 0.4, 0.02, layers=4, width=128, heads=8, seed=18, round=2),
        Setup("adamw_lambda_ramp", "adamw", 0.5, 1e-3, schedule="ramp", base=1e-3,
              scheduler="lambda", warmup=40, seed=21, round=3),
        Setup("adamw_onecycle_hot", "adamw", 0.1, 3e-3, scheduler="onecycle", seed=22, round=3),
        Setup("adamw_onecycle_ok", "adamw", 3e-3, 3e-3, scheduler="onecycle", seed=23, round=3),
        Setup("adamw_accum_rewarm", "adamw", 0.3, 3e-3, schedule="rewarm", base=3e-3,
              rise_from=300, rise_to=400, accumulate=4, seed=24, round=3),
        Setup("adamw_accum_ok", "adamw", 3e-3, 3e-3, accumulate=2, seed=25, round=3),
        Setup("adamw_rms_hot", "adamw", 3e-2, 3e-3, rms=True, seed=26, round=3),
        Setup("adamw_rms_ramp", "adamw", 1.0, 1e-3, schedule="ramp", base=1e-3, rms=True,
              warmup=40, seed=27, round=3),
        Setup("adamw_deep8_ramp", "adamw", 0.3, 1e-3, schedule="ramp", base=1e-3, layers=8,
              warmup=40, seed=28, round=3),
        Setup("lion_lambda_rewarm", "lion", 3e-2, 3e-4, schedule="rewarm", base=3e-4,
              scheduler="lambda", seed=29, round=3),
        Setup("lion_rms_x5", "lion", 0.05, 3e-4, rms=True, warmup=150, schedule="constant",
              seed=30, round=3),
        Setup("sgd_lambda_ramp", "sgd", 20.0, 0.1, schedule="ramp", base=0.1,
              scheduler="lambda", seed=31, round=3),
        Setup("sgd_onecycle_hot", "sgd", 8.0, 0.3, scheduler="onecycle", seed=32, round=3),
        Setup("sgd_accum_jump", "sgd", 8.0, 0.3, schedule="jump", base=0.3, rise_from=300,
              accumulate=2, seed=33, round=3),
        Setup("muon_rms_rewarm", "muon", 1.0, 0.02, schedule="rewarm", base=0.02, rms=True,
              seed=34, round=3),
        Setup("muon_accum_hot", "muon", 0.6, 0.02, accumulate=2, warmup=150, seed=35, round=3),
        Setup("adamw_rms_jump", "adamw", 0.3, 3e-3, schedule="jump", base=3e-3, rise_from=300,
              rms=True, seed=36, round=3),
        Setup("adamw_rms_ok", "adamw", 3e-3, 3e-3, rms=True, seed=37, round=3),
        Setup("adamw_lambda_long", "adamw", 1.0, 1e-3, schedule="ramp", base=1e-3,
              scheduler="lambda", steps=1000, rise_from=300, rise_to=900, seed=38, round=3),
        Setup("adamw_ramp300", "adamw", 0.3, 1e-3, schedule="ramp", base=1e-3, width=96,
              layers=3, rise_from=200, rise_to=500, seed=41, round=4),
        Setup("adamw_onecycle_x30", "adamw", 0.09, 3e-3, scheduler="onecycle", layers=4,
              seed=42, round=4),
        Setup("adamw_rewarm_lambda", "adamw", 0.2, 2e-3, schedule="rewarm", base=2e-3,
              scheduler="lambda", rise_from=350, rise_to=450, seed=43, round=4),
        Setup("adamw_post_rms_ramp", "adamw", 0.5, 1e-3, schedule="ramp", base=1e-3,
              post_ln=True, rms=True, warmup=60, seed=44, round=4),
        Setup("adamw_accum_ramp", "adamw", 0.4, 1e-3, schedule="ramp", base=1e-3,
              accumulate=2, warmup=60, rise_from=200, rise_to=400, seed=45, round=4),
        Setup("adamw_wide_rewarm", "adamw", 0.1, 2e-3, schedule="rewarm", base=2e-3,
              width=128, heads=8, seed=46, round=4),
        Setup("adamw_nopos_jump", "adamw", 0.3, 3e-3, schedule="jump", base=3e-3,
              positions=False, rise_from=250, seed=47, round=4),
        Setup("adamw_b2_999_ramp", "adamw", 0.3, 1e-3, schedule="ramp", base=1e-3,
              beta2=0.999, warmup=60, seed=48, round=4),
        Setup("adamw_ok_long", "adamw", 3e-3, 3e-3, steps=900, layers=3, seed=49, round=4),
        Setup("lion_onecycle", "lion", 0.02, 3e-4, scheduler="onecycle", seed=50, round=4),
        Setup("lion_ramp_slow", "lion", 0.03, 1e-4, schedule="ramp", base=1e-4, steps=900,
              rise_from=250, rise_to=750, seed=51, round=4),
        Setup("sgd_rewarm", "sgd", 6.0, 0.3, schedule="rewarm", base=0.3, seed=52, round=4),
        Setup("sgd_lambda_hot", "sgd", 5.0, 0.3, scheduler="lambda", warmup=80, seed=53,
              round=4),
        Setup("sgd_ok", "sgd", 0.3, 0.3, seed=54, round=4),
        Setup("muon_lambda", "muon", 0.5, 0.02, scheduler="lambda", seed=55, round=4),
        Setup("muon_jump", "muon", 0.8, 0.02, schedule="jump", base=0.02, rise_from=300,
              seed=56, round=4),
        Setup("muon_ramp_slow", "muon", 1.0, 0.02, schedule="ramp", base=0.02, steps=900,
              rise_from=250, rise_to=750, seed=57, round=4),
        Setup("muon_ok", "muon", 0.02, 0.02, seed=58, round=4),
        Setup("radam_hot", "radam", 3e-2, 3e-3, seed=61, round=5),
        Setup("radam_ramp", "radam", 1.0, 1e-3, schedule="ramp", base=1e-3, warmup=40, seed=62,
              round=5),
        Setup("nadam_hot", "nadam", 9e-2, 3e-3, schedule="constant", warmup=150, seed=63,
              round=5),
        Setup("nadam_ok", "nadam", 3e-3, 3e-3, seed=64, round=5),
        Setup("rmsprop_hot", "rmsprop", 1e-2, 1e-3, seed=65, round=5),
        Setup("rmsprop_rewarm", "rmsprop", 0.1, 1e-3, schedule="rewarm", base=1e-3,
              rise_from=300, rise_to=400, seed=66, round=5),
        Setup("adagrad_rewarm", "adagrad", 3.0, 0.05, schedule="rewarm", base=0.05,
              rise_from=300, rise_to=400, seed=67, round=5),
        Setup("adafactor_ok", "adafactor", 1e-2, 1e-2, seed=68, round=5),
        Setup("adam_l2_rewarm", "adam", 0.3, 3e-3, schedule="rewarm", base=3e-3,
              rise_from=300, rise_to=400, seed=69, round=5),
        Setup("adamw_bf16_rewarm", "adamw", 0.3, 3e-3, schedule="rewarm", base=3e-3,
              rise_from=300, rise_to=400, amp="bf16", seed=70, round=5),
        Setup("adamw_fp16_jump", "adamw", 0.3, 3e-3, schedule="jump", base=3e-3,
              rise_from=300, amp="fp16", seed=71, round=5),
        Setup("adamw_fp16_ok", "adamw", 3e-3, 3e-3, amp="fp16", seed=72, round=5),
        Setup("adamw_fp16_ramp", "adamw", 1.0, 1e-3, schedule="ramp", base=1e-3, warmup=40,
              amp="fp16", seed=73, round=5),
        Setup("adamw_restarts_hot", "adamw", 5e-2, 3e-3, scheduler="restarts", seed=74,
              round=5),
        Setup("adamw_restarts_ok", "adamw", 3e-3, 3e-3, scheduler="restarts", seed=75, round=5),
        Setup("adamw_dropout_ramp", "adamw", 1.0, 1e-3, schedule="ramp", base=1e-3, warmup=40,
              dropout=0.1, seed=76, round=5),
        Setup("nesterov_ramp", "nesterov", 10.0, 0.1, schedule="ramp", base=0.1, seed=77,
              round=5),
        Setup("lion_bf16_hot", "lion", 3e-2, 3e-4, amp="bf16", seed=78, round=5),
        Setup("adamw_decay_ramp", "adamw", 1.0, 1e-3, schedule="ramp", base=1e-3, warmup=40,
              groups="decay", seed=81, round=6),
        Setup("adamw_decay_ok", "adamw", 3e-3, 3e-3, groups="decay", seed=82, round=6),
        Setup("adamw_scaled_rewarm", "adamw", 0.3, 3e-3, schedule="rewarm", base=3e-3,
              rise_from=300, rise_to=400, groups="scaled", seed=83, round=6),
        Setup("adamw_scaled_lambda", "adamw", 0.3, 3e-3, schedule="rewarm", base=3e-3,
              rise_from=300, rise_to=400, groups="scaled", scheduler="lambda", seed=84,
              round=6),
        Setup("adamw_scaled_ok", "adamw", 3e-3, 3e-3, groups="scaled", seed=85, round=6),
        Setup("sgd_decay_ramp", "sgd", 10.0, 0.1, schedule="ramp", base=0.1, groups="decay",
              seed=86, round=6),
        Setup("lion_scaled_hot", "lion", 3e-2, 3e-4, groups="scaled", seed=87, round=6),
        Setup("adamw_eval_rewarm", "adamw", 0.3, 3e-3, schedule="rewarm", base=3e-3,
              rise_from=300, rise_to=400, evaluate=25, seed=88, round=6),
        Setup("adamw_eval_ok", "adamw", 3e-3, 3e-3, evaluate=25, seed=89, round=6),
        Setup("adamw_eval_dropout", "adamw", 1.0, 1e-3, schedule="ramp", base=1e-3, warmup=40,
              evaluate=50, dropout=0.1, seed=90, round=6),
        Setup("adamw_ckpt_ramp", "adamw", 1.0, 1e-3, schedule="ramp", base=1e-3, warmup=40,
              checkpointing=True, seed=91, round=6),
        Setup("adamw_ckpt_ok", "adamw", 3e-3, 3e-3, checkpointing=True, seed=92, round=6),
        Setup("adamw_frozen_rewarm", "adamw", 0.3, 3e-3, schedule="rewarm", base=3e-3,
              rise_from=300, rise_to=400, frozen=True, seed=93, round=6),
        Setup("adamw_userclip_ramp", "adamw", 1.0, 1e-3, schedule="ramp", base=1e-3,
              warmup=40, user_clip=True, seed=94, round=6),
        Setup("adamw_userclip_ok", "adamw", 3e-3, 3e-3, user_clip=True, seed=95, round=6),
        Setup("nadam_decay_rewarm", "nadam", 0.3, 3e-3, schedule="rewarm", base=3e-3,
              rise_from=300, rise_to=400, groups="decay", seed=96, round=6),
        Setup("muon_eval_ramp", "muon", 2.0, 0.02, schedule="ramp", base=0.02, evaluate=25,
              seed=97, round=6),
        Setup("adamw_all_ok", "adamw", 3e-3, 3e-3, groups="decay", evaluate=25, dropout=0.1,
              checkpointing=True, amp="bf16", seed=98, round=6),
    )
}  # fmt: skip


def lr_at(setup: Setup, step: int, peak: float) -> float:
    """The LR the loop sets at ``step`` for a schedule peaking at ``peak``."""
    if setup.schedule in ("ramp", "rewarm", "jump"):
        base = min(setup.base, peak)
        if step < setup.warmup:
            return base * (step + 1) / setup.warmup
        if step < setup.rise_from:
            return base
        if setup.schedule == "jump":
            return peak
        if step >= setup.rise_to:
            return peak
        share = (step - setup.rise_from) / (setup.rise_to - setup.rise_from)
        if setup.schedule == "ramp":
            return base * (peak / base) ** share
        return base + (peak - base) * share
    if step < setup.warmup:
        return peak * (step + 1) / setup.warmup
    if setup.schedule == "constant":
        return peak
    share = (step - setup.warmup) / max(1, setup.steps - setup.warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * share)))


def _model(setup: Setup):
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Attention(nn.Module):
        def __init__(self, width: int, heads: int):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(width, 3 * width, bias=False)
            self.out = nn.Linear(width, width, bias=False)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (
                z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                for z in self.qkv(x).split(d, 2)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, t, d))

    class SwiGLU(nn.Module):
        def __init__(self, width: int):
            super().__init__()
            hidden = 8 * width // 3
            self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
            self.down = nn.Linear(hidden, width, bias=False)

        def forward(self, x):
            gate, up = self.gate_up(x).chunk(2, -1)
            return self.down(F.silu(gate) * up)

    Norm = nn.RMSNorm if setup.rms else nn.LayerNorm

    class Block(nn.Module):
        def __init__(self, width: int, heads: int, post_ln: bool):
            super().__init__()
            self.post_ln = post_ln
            self.norm1, self.norm2 = Norm(width), Norm(width)
            self.attention = Attention(width, heads)
            self.mlp = (
                SwiGLU(width)
                if setup.rms
                else nn.Sequential(
                    nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
                )
            )

        def _drop(self, y):
            return F.dropout(y, setup.dropout, self.training)  # p 0: the input itself

        def forward(self, x):
            if self.post_ln:
                x = self.norm1(x + self._drop(self.attention(x)))
                return self.norm2(x + self._drop(self.mlp(x)))
            x = x + self._drop(self.attention(self.norm1(x)))
            return x + self._drop(self.mlp(self.norm2(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            width = setup.width
            self.embedding = nn.Embedding(VOCAB, width)
            self.positions = (
                nn.Parameter(torch.randn(SEQ, width) * 0.02) if setup.positions else None
            )
            self.blocks = nn.ModuleList(
                Block(width, setup.heads, setup.post_ln) for _ in range(setup.layers)
            )
            self.norm = Norm(width)
            self.head = nn.Linear(width, VOCAB, bias=False)
            if setup.tied:
                self.head.weight = self.embedding.weight

        def forward(self, tokens):
            x = self.embedding(tokens)
            if self.positions is not None:
                x = x + self.positions[: tokens.shape[1]]
            for block in self.blocks:
                if setup.checkpointing and self.training:
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            return self.head(self.norm(x))

    torch.manual_seed(setup.seed)
    net = Net()
    net.embedding.weight.requires_grad_(not setup.frozen)
    return net


def _language(seed: int):
    """Next-token probabilities per (last-but-one, last) token pair, row a * VOCAB + b."""
    import torch

    torch.manual_seed(1000 + seed)
    alpha = torch.full((VOCAB,), 0.1)
    by_last = torch.distributions.Dirichlet(alpha).sample((VOCAB,))
    by_pair = torch.distributions.Dirichlet(alpha).sample((VOCAB * VOCAB,))
    return 0.5 * by_last.repeat(VOCAB, 1) + 0.5 * by_pair


def _sample(probs, generator):
    import torch

    tokens = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
    tokens[:, :2] = torch.randint(0, VOCAB, (BATCH, 2), generator=generator)
    for i in range(2, SEQ + 1):
        pair = tokens[:, i - 2] * VOCAB + tokens[:, i - 1]
        tokens[:, i] = torch.multinomial(probs[pair], 1, generator=generator).squeeze(1)
    return tokens


def _optimizer(setup: Setup, model, lr: float):
    import torch

    params = _groups(setup, model)
    if setup.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, setup.beta2), weight_decay=0.1)
    if setup.optimizer in ("sgd", "nesterov"):
        return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=setup.optimizer != "sgd")
    torch_own = {
        "adam": lambda: torch.optim.Adam(params, lr=lr, weight_decay=0.01),
        "radam": lambda: torch.optim.RAdam(params, lr=lr, decoupled_weight_decay=True,
                                           weight_decay=0.1),
        "nadam": lambda: torch.optim.NAdam(params, lr=lr),
        "rmsprop": lambda: torch.optim.RMSprop(params, lr=lr),
        "adagrad": lambda: torch.optim.Adagrad(params, lr=lr),
        "adafactor": lambda: torch.optim.Adafactor(params, lr=lr),
    }  # fmt: skip
    if setup.optimizer in torch_own:
        return torch_own[setup.optimizer]()
    if setup.optimizer == "lion":
        from collapse_guard.datasets.real.optim import Lion

        return Lion(params, lr=lr)
    from collapse_guard.integrations.chained import ChainedOptimizer

    hidden = [
        p for n, p in model.named_parameters()
        if p.ndim == 2 and not n.startswith(("embedding", "head")) and n != "positions"
    ]  # fmt: skip
    ids = {id(p) for p in hidden}
    rest = [p for p in params if id(p) not in ids]
    muon = torch.optim.Muon(hidden, lr=lr, momentum=0.95, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW(rest, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    return ChainedOptimizer(muon, adamw)


def _groups(setup: Setup, model) -> list:
    """The model's parameters as the optimizer takes them: one list, or groups."""
    named = list(model.named_parameters())
    if setup.groups == "decay":  # SGD's decay is L2 on the gradient: nanoGPT's 0.1 there
        decay = 5e-4 if setup.optimizer in ("sgd", "nesterov") else 0.1  # stops learning
        return [
            {"params": [p for _, p in named if p.ndim >= 2], "weight_decay": decay},
            {"params": [p for _, p in named if p.ndim < 2], "weight_decay": 0.0},
        ]
    if setup.groups == "scaled":
        outer = ("embedding", "head")
        return [
            {"params": [p for n, p in named if not n.startswith(outer)]},
            {"params": [p for n, p in named if n.startswith(outer)], "lr_scale": 0.1},
        ]
    return [p for _, p in named]


def _scheduler(setup: Setup, optimizer, peak: float):
    """torch's scheduler the loop steps after each step (None: the loop sets the LR)."""
    from torch.optim import lr_scheduler

    if setup.scheduler == "lambda":
        for group in optimizer.param_groups:
            group["lr"] = peak * group.get("lr_scale", 1.0)
        return lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(setup, step, peak) / peak)
    if setup.scheduler == "onecycle":  # cycles AdamW's beta1 and SGD's momentum too
        share = min(0.5, setup.warmup / setup.steps)
        return lr_scheduler.OneCycleLR(optimizer, peak, setup.steps + 1, pct_start=share)
    if setup.scheduler == "restarts":  # back to the peak at once, every 150 steps
        for group in optimizer.param_groups:
            group["lr"] = peak
        return lr_scheduler.CosineAnnealingWarmRestarts(optimizer, 150, eta_min=0.01 * peak)
    return None


def train(setup: Setup, arm: str, switch: int = 0, announce: bool = False) -> dict:
    """One set-up by one arm, in the user's loop: its losses and the guard's summary.
    ``switch``: the step the loop moves to another language (seed + 500; 0: never), and
    says so by ``guard.data_changed()`` with ``announce`` (``benchmarks/data_switch.py``)."""
    import torch
    from torch.nn import functional as F

    from collapse_guard.guard import Guard, GuardGaveUp

    torch.set_num_threads(1)
    model, probs = _model(setup), _language(setup.seed)
    peak = setup.safe_lr if arm == "safe" else setup.lr
    optimizer = _optimizer(setup, model, lr_at(setup, 0, peak))
    scheduler = _scheduler(setup, optimizer, peak)
    generator, language = torch.Generator().manual_seed(setup.seed + 99), [probs]
    draws = 3 * setup.steps * setup.accumulate  # lazily: a batch of the language in force
    batches = (_sample(language[0], generator) for _ in range(draws))
    held_out = _sample(probs, torch.Generator().manual_seed(setup.seed + 7))
    losses, summary, started = [], {}, time.perf_counter()
    scaler = torch.amp.GradScaler("cpu") if setup.amp == "fp16" else None
    autocast = torch.autocast(
        "cpu", dtype=torch.float16 if setup.amp == "fp16" else torch.bfloat16,
        enabled=bool(setup.amp),
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        guard = (
            Guard(model, optimizer, checkpoint_dir=folder, scaler=scaler)
            if arm == "guarded"
            else None
        )
        source = iter(guard.batches(batches) if guard else batches)
        for step in range(setup.steps):
            if switch and step == switch:
                language[0] = _language(setup.seed + 500)
                if guard is not None and announce:
                    guard.data_changed()
            if scheduler is None:
                for group in optimizer.param_groups:  # ChainedOptimizer's are its parts
                    group["lr"] = lr_at(setup, step, peak) * group.get("lr_scale", 1.0)
            loss = 0.0
            for batch in itertools.islice(source, setup.accumulate):
                with autocast:
                    logits = model(batch[:, :-1])
                part = F.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
                scaled = part / setup.accumulate
                (scaler.scale(scaled) if scaler else scaled).backward()
                loss = loss + part.detach() / setup.accumulate
            losses.append(float(loss))
            if setup.user_clip and guard is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), setup.clip)
            if guard is None:
                if scaler:
                    scaler.unscale_(optimizer)
                if setup.clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), setup.clip)
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
            else:
                try:
                    guard.step(loss)
                except GuardGaveUp as stop:
                    summary["gave_up"] = str(stop)[:200]
                    break
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None:
                scheduler.step()
            if setup.evaluate and step % setup.evaluate == 0:
                _evaluate(model, held_out, autocast)
        if guard is not None:
            summary.update(
                {k: v for k, v in guard.summary().items() if isinstance(v, (int, float, str))}
            )
            guard.close()
    return {
        "setup": setup.name,
        "arm": arm,
        "losses": [x if math.isfinite(x) else None for x in losses],
        "seconds": round(time.perf_counter() - started, 1),
        "summary": summary,
    }


def _evaluate(model, batch, autocast) -> None:
    """The loop's evaluation forward: eval mode, no gradients, back to training (what the
    guard must not mistake for a training step; its loss is not needed here)."""
    import torch

    model.eval()
    with torch.no_grad(), autocast:
        model(batch[:, :-1])
    model.train()


def _job(job: tuple[str, str]) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return train(SETUPS[job[0]], job[1])


def _final(losses: list) -> float:
    tail = losses[-FINAL_STEPS:]
    if not tail or any(x is None for x in tail):
        return math.inf
    return sum(tail) / len(tail)


def _onset(losses: list) -> int | None:
    from guard_rescue import label_losses  # beside this file: python puts its folder first

    return label_losses([math.nan if x is None else x for x in losses])[0]


def _forecast_line(rows: dict, collapsed: list[str], quiet: list[str]) -> None:
    """The forecast as shipped, read off the guarded arm (``guard.first_warning``, the first
    step at ``warn``, against the unguarded run's onset): issue 34's figure in this loop."""
    leads, late = [], 0
    for name in collapsed:
        onset = _onset(rows[name, "unguarded"]["losses"])
        first = rows[name, "guarded"]["summary"].get("first_warning")
        if first is not None and first < onset:
            leads.append(onset - first)
        late += first is not None and first >= onset
    ahead = sorted(lead for lead in leads if 10 <= lead <= 200)
    alarms = sum(
        rows[name, "guarded"]["summary"].get("first_warning") is not None for name in quiet
    )
    steps = sum(SETUPS[name].steps for name in quiet)
    median = f", median lead {ahead[len(ahead) // 2]}" if ahead else ""
    print(f"\nforecast at warn: {len(ahead)}/{len(collapsed)} collapses warned 10-200 steps "
          f"ahead{median} ({len(leads) - len(ahead)} under 10, {late} at or after the onset); "
          f"set-ups that do not collapse warned: {alarms}/{len(quiet)}, "
          f"{1e4 * alarms / max(steps, 1):.2f} per 10k of their steps")  # fmt: skip


def _report(rows: dict[tuple[str, str], dict], names: list[str]) -> None:
    print("| set-up | optimizer | unguarded (onset) | guarded | rescues | safe | guarded - safe |")
    print("|---|---|---|---|---|---|---|")
    collapsed, saved, quiet = [], [], []
    for name in names:
        setup, arms = SETUPS[name], {arm: rows.get((name, arm)) for arm in ARMS}
        if any(row is None for row in arms.values()):
            continue
        final = {arm: _final(row["losses"]) for arm, row in arms.items()}
        onset = _onset(arms["unguarded"]["losses"])
        guarded_onset = _onset(arms["guarded"]["losses"])
        gap = final["guarded"] - final["safe"]
        if onset is None:
            quiet.append((final["guarded"] - final["unguarded"], name))
        else:
            collapsed.append(name)
            if guarded_onset is None and gap <= 0.05:
                saved.append(name)
        onset_text = "healthy" if onset is None else f"collapsed {onset}"
        rescues = arms["guarded"]["summary"].get("rescues", "-")
        print(
            f"| {name} | {setup.optimizer} | {final['unguarded']:.3f} ({onset_text}) | "
            f"{final['guarded']:.3f} | {rescues} | {final['safe']:.3f} | {gap:+.3f} |"
        )
    _forecast_line(rows, collapsed, [name for _, name in quiet])
    missed = ", ".join(sorted(set(collapsed) - set(saved))) or "none"
    print(f"\ncollapses saved (no onset, within 0.05 nats of the safe run): "
          f"{len(saved)}/{len(collapsed)} (missed: {missed})")  # fmt: skip
    if quiet:
        diffs = sorted(d for d, _ in quiet)
        worst = max(quiet)
        print(f"not collapsing, guarded - unguarded: median {diffs[len(diffs) // 2]:+.3f}, "
              f"worst {worst[0]:+.3f} ({worst[1]}), {len(quiet)} set-ups")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="results, JSON lines")
    parser.add_argument("--setups", nargs="+", choices=list(SETUPS), default=list(SETUPS))
    rounds = sorted({setup.round for setup in SETUPS.values()})
    parser.add_argument("--round", type=int, choices=rounds, help="this round's set-ups")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if args.round:
        args.setups = [n for n in args.setups if SETUPS[n].round == args.round]
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # for the spawned workers
    done = {}
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            row = json.loads(line)
            done[row["setup"], row["arm"]] = row
    jobs = [(s, a) for s in args.setups for a in args.arms if (s, a) not in done]
    if not args.report_only and jobs:
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            with args.out.open("a") as out:
                for row in pool.imap_unordered(_job, jobs):
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    done[row["setup"], row["arm"]] = row
                    print(f"{row['setup']:>18} {row['arm']:<10} {_final(row['losses']):.3f} "
                          f"{row['seconds']} s", flush=True)  # fmt: skip
    _report(done, args.setups)


if __name__ == "__main__":
    main()
