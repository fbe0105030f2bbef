"""Assemble one synthetic run: signal-group traces -> a run frame as the probe records it.

After the signal-group builders (``traces.py``) this applies, in order: divergence to
non-finite values, the AMP scaler, measurement periods (NaN between probes, from the
signal table), curvature off, gaps, and the crash that ends some diverged runs.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from collapse_guard.datasets.synthetic.amp import replay_grad_scaler
from collapse_guard.datasets.synthetic.shapes import lr_schedule, make_shapes
from collapse_guard.datasets.synthetic.spec import RunSpec
from collapse_guard.datasets.synthetic.traces import (
    Ctx,
    attention_traces,
    gradient_traces,
    loss_trace,
    output_traces,
    system_traces,
    update_traces,
)
from collapse_guard.runfiles import RUN_COLUMNS
from collapse_guard.signals import SIGNALS

__all__ = ["PARAMETER_SIGNALS", "make_frame"]

_GROUP = {s.name: s.group for s in SIGNALS}
_PERIOD = {s.name: s.period for s in SIGNALS}
# The signals computed from the parameters: the update they took and the probe batch's
# forward through them (attention, output). The shortcut checks read them too.
PARAMETER_SIGNALS: tuple[str, ...] = (
    "update_cos",
    "update_flips",
    "update_ratio",
    "param_norm",
    "attn_kl",
    "attn_saturation",
    "attn_entropy_min",
    "attn_entropy_mean",
    "attn_logit_max",
    "output_logit_max",
    "output_entropy",
    "output_repetition",
)
# After a divergence without a scaler the parameters are NaN: everything computed from
# them (updates, probe-batch forward) is measured and non-finite.
_NAN_AFTER_DIVERGENCE = ("grad_cv", "bottom_grad_norm", *PARAMETER_SIGNALS)


def make_frame(spec: RunSpec) -> pd.DataFrame:
    """The run frame of ``spec``: columns ``RUN_COLUMNS``, one row per recorded step.

    Deterministic: the same spec gives the same frame, bit for bit.
    """
    rng = np.random.default_rng(spec.seed)
    t = np.arange(spec.n_steps, dtype=float)
    lr = lr_schedule(spec, t)
    c = Ctx(spec=spec, t=t, lr=lr, sh=make_shapes(spec, t, rng), rng=rng)
    cols: dict[str, np.ndarray] = {"lr": lr}
    cols.update(loss_trace(c))  # first: output_traces reads c.loss_clean
    cols.update(gradient_traces(c))
    cols.update(update_traces(c))
    cols.update(attention_traces(c))
    cols.update(output_traces(c))
    cols.update(system_traces(c))
    cols["loss_nonfinite"] = np.zeros(t.size)
    diverged = c.sh.after if spec.kind == "nonfinite" else np.zeros(t.size, dtype=bool)
    if diverged.any():
        _diverge(cols, diverged, rng, spec.amp)
    if spec.amp:
        _apply_amp(cols, diverged, rng)
    else:
        cols["loss_scale"] = np.full(t.size, math.nan)
        cols["overflow"] = np.zeros(t.size)
    for name in RUN_COLUMNS[1:-1]:  # what synthetic runs do not model: curvature, optimizer state
        cols.setdefault(name, np.full(t.size, math.nan))
    steps = t.astype(np.int64)
    for name, period in _PERIOD.items():
        if period > 1:
            cols[name] = np.where(steps % period == 0, cols[name], math.nan)
    keep = np.ones(t.size, dtype=bool)
    for gap in spec.gaps:
        span = (steps >= gap.start) & (steps < gap.start + gap.length)
        if gap.what == "rows":
            keep &= ~span
        else:
            for name, group in _GROUP.items():
                if group == gap.what:
                    cols[name] = np.where(span, math.nan, cols[name])
    if spec.truncate_after is not None and spec.onset is not None:
        keep &= steps <= spec.onset + spec.truncate_after
    _as_measured(cols)
    frame = pd.DataFrame({"step": steps, **{name: cols[name] for name in RUN_COLUMNS[1:-1]}})
    frame["event"] = ""
    return frame.loc[keep].reset_index(drop=True)


def _as_measured(cols: dict[str, np.ndarray]) -> None:
    """Round to what the probe can report: float32 tensors, integer bytes, NVML milliwatts.

    The probe reads float32 tensors (``.item()`` of a float32 is float32-exact), so
    finer digits would be noise no real run has; it also makes files ~40% smaller.
    The LR is a Python float in the param group and stays float64.
    """
    for name, values in cols.items():
        if name in ("host_mem_available", "gpu_mem_used"):
            cols[name] = np.round(values / 1024) * 1024  # /proc/meminfo counts kB
        elif name == "gpu_power_w":
            cols[name] = np.round(values * 1000) / 1000  # NVML reports milliwatts
        elif name != "lr":
            cols[name] = values.astype(np.float32).astype(np.float64)


def _diverge(
    cols: dict[str, np.ndarray], mask: np.ndarray, rng: np.random.Generator, amp: bool
) -> None:
    """From onset on the loss is NaN or inf (measured: loss_nonfinite = 1)."""
    bad = math.inf if rng.random() < 0.5 else math.nan
    cols["loss"] = np.where(mask, bad, cols["loss"])
    cols["loss_nonfinite"] = mask.astype(float)
    cols["grad_norm"] = np.where(mask, math.inf if amp else math.nan, cols["grad_norm"])
    count = rng.integers(10_000, 2_000_000)  # every gradient element of a small model
    cols["grad_nonfinite"] = np.where(mask, float(count), cols["grad_nonfinite"])
    if amp:
        # The scaler skips every step: parameters stay finite and frozen, updates are zero.
        first = int(np.argmax(mask))
        cols["param_norm"] = np.where(
            mask, cols["param_norm"][max(first - 1, 0)], cols["param_norm"]
        )
        cols["update_ratio"] = np.where(mask, 0.0, cols["update_ratio"])
        skipped = ("update_cos", "update_flips", "grad_cv", "bottom_grad_norm")
        nan_after = [
            *skipped,
            *(n for n in _NAN_AFTER_DIVERGENCE if n.startswith(("attn_", "output_"))),
        ]
    else:
        nan_after = list(_NAN_AFTER_DIVERGENCE)
    for name in nan_after:
        cols[name] = np.where(mask, math.nan, cols[name])


def _apply_amp(cols: dict[str, np.ndarray], diverged: np.ndarray, rng: np.random.Generator) -> None:
    """GradScaler: overflowed steps have inf gradients and are skipped (no update)."""
    finite_norm = np.where(np.isfinite(cols["grad_norm"]), cols["grad_norm"], 1e30)
    scale, overflow = replay_grad_scaler(finite_norm, diverged, rng)
    cols["loss_scale"], cols["overflow"] = scale, overflow
    hit = overflow > 0
    cols["grad_norm"] = np.where(hit, math.inf, cols["grad_norm"])
    counts = rng.integers(1, 5_000, size=hit.size).astype(float)
    cols["grad_nonfinite"] = np.where(hit & ~diverged, counts, cols["grad_nonfinite"])
    cols["update_ratio"] = np.where(hit, 0.0, cols["update_ratio"])
    cols["update_cos"] = np.where(hit, math.nan, cols["update_cos"])
