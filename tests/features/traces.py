"""Shared traces for the features tests: real-looking runs, built by hand."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

MUON_LOG = (
    Path(__file__).resolve().parents[3]
    / "shared/realdata/modded-nanogpt/records/track_1_short/2024-10-10_Muon"
)
_TRAIN_LINE = re.compile(r"^step:(\d+)/\d+ train_loss:([0-9.naif+-]+)")


def probe_like_run(steps: int = 700, seed: int = 0, collapse: bool = True) -> pd.DataFrame:
    """A run as the probe records it: per-step signals, attention every 50 steps,
    system every 100, a hole in the log, and (optionally) a NaN loss at the end."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    frame = pd.DataFrame({"step": t + 1})
    frame["loss"] = 3.0 * np.exp(-t / 300) + 2.5 + rng.normal(0, 0.05, steps)
    frame["loss_nonfinite"] = 0.0
    frame["lr"] = np.minimum(1.0, (t + 1) / 100) * 3e-4
    frame["grad_norm"] = rng.lognormal(0, 0.3, steps)
    frame["grad_cv"] = rng.uniform(0.2, 0.6, steps)
    frame["update_cos"] = rng.uniform(0.0, 1.0, steps)
    frame["param_norm"] = 300.0 + np.cumsum(rng.normal(0, 1e-3, steps))
    frame["attn_kl"] = np.where(t % 50 == 0, rng.uniform(0.0, 2.0, steps), np.nan)
    frame["attn_entropy_min"] = np.where(t % 50 == 0, rng.uniform(1, 3, steps), np.nan)
    frame["host_mem_available"] = np.where(t % 100 == 0, 1.6e10 + rng.normal(0, 1e7, steps), np.nan)
    frame.loc[200:240, ["loss", "grad_norm", "grad_cv", "update_cos"]] = np.nan  # unlogged steps
    frame = frame.drop(index=range(300, 330), errors="ignore")  # rows missing entirely
    frame["event"] = ""
    if collapse:
        end = frame.index[-5:]
        frame.loc[end, "loss"] = np.nan
        frame.loc[end, "loss_nonfinite"] = 1.0
        frame.loc[end[-1], "grad_norm"] = np.inf
    return frame.reset_index(drop=True)


def muon_log_run(rows: int = 450) -> pd.DataFrame:
    """The first ``rows`` training-loss lines of a real modded-nanogpt log."""
    files = sorted(MUON_LOG.glob("*.txt")) if MUON_LOG.is_dir() else []
    if not files:
        pytest.skip(f"real log not available under {MUON_LOG}")
    steps, losses = [], []
    with files[0].open() as fh:
        for line in fh:
            match = _TRAIN_LINE.match(line)
            if match:
                steps.append(int(match.group(1)))
                losses.append(float(match.group(2)))
                if len(steps) == rows:
                    break
    frame = pd.DataFrame({"step": steps, "loss": losses})
    # keep every row but thin the middle to every 5th step, as many loggers do
    keep = (frame["step"] < 150) | (frame["step"] > 300) | (frame["step"] % 5 == 0)
    return frame[keep].reset_index(drop=True)


def rewarm_run(steps: int = 900, seed: int = 0) -> pd.DataFrame:
    """A run (``steps`` > 600) that exercises every context field: warm-up, cosine
    decay, a re-warm to twice the peak at step 600, attention logits every 10 steps that
    grow after it, a hole in the log, and a non-finite loss at the end."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    peak = 3e-4
    cosine = peak * (0.55 + 0.45 * np.cos(np.pi * np.clip(t - 100, 0, None) / steps))
    lr = np.where(t < 100, peak * (t + 1) / 100, cosine)
    lr = np.where(t >= 600, np.minimum(2 * peak, lr[599] + (t - 599) * peak / 50), lr)
    frame = pd.DataFrame({"step": t, "lr": lr})
    frame["loss"] = 2.5 + 3.0 * np.exp(-t / 150) + rng.normal(0, 0.05, steps)
    frame.loc[650:, "loss"] += (t[650:] - 650) * 0.004  # it climbs once the LR is high
    frame["loss_nonfinite"] = 0.0
    frame["grad_norm"] = rng.lognormal(0, 0.3, steps) * np.where(t >= 600, 3.0, 1.0)
    frame["param_norm"] = 300.0 + 0.01 * t + rng.normal(0, 1e-3, steps)
    growth = np.exp(np.clip(t - 620, 0, None) / 80)
    frame["attn_logit_max"] = np.where(
        t % 10 == 0, 20.0 * growth + rng.normal(0, 0.5, steps), np.nan
    )
    frame["output_logit_max"] = 15.0 + rng.normal(0, 0.3, steps) + 0.02 * np.maximum(t - 600, 0)
    frame["grad_cv"] = rng.uniform(0.2, 0.5, steps)
    frame = frame.drop(index=range(400, 430))  # rows missing entirely
    frame.loc[frame.index[-2:], "loss"] = np.nan
    frame.loc[frame.index[-2:], "loss_nonfinite"] = 1.0
    return frame.reset_index(drop=True)
