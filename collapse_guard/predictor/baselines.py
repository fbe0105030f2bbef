"""What people use today, as per-step scorers the model is compared against.

Each baseline gives, for every row of a run frame (``step`` + signal columns):

- ``score_run(frame)``: a continuous score, higher = more alarming, NaN = no opinion
  yet (warming up), so it can be evaluated at the same false-alarm budget as the
  model (the threshold is then set on healthy steps);
- ``alarm_run(frame)``: its own native rule, as the original code fires it.

- ``dsi``: the seed's Dynamic Stability Index. Native: grad_cv > 0.45 and attn_kl
  outside [0.2, 1.5] and update_cos outside [0.1, 0.9], all three at once. Score: the
  smallest of the three normalised exceedances (> 0 exactly when all three are over).
- ``olmo_zscore``: OLMo-core's ``SkipStepOptimizer`` on the loss. Native:
  loss - mean > 6 std of the previous 128 losses (judging from 64 losses on).
  Score: (loss - mean) / std.
- ``zclip``: ZClip. Native: z > 2.5 of grad_norm against an EMA (alpha 0.97) mean and
  variance set by a 25-step warm-up and updated with the clipped norm. Score: z.
- ``kill_spike``: llm-foundry's ``KillLossSpike``. Native: loss >= 2x the mean of the
  previous 100 losses for 5 steps in a row (patience 4), or half the window over the
  loss cap (the first window's largest loss). Score: the smallest loss / window-mean
  ratio of the last 5 steps (>= 2 exactly when 5 in a row are outliers).
- ``config_only``: what the config says, without any signal: a small LightGBM on the
  LR in force, the step and the peak LR so far, fitted on the training runs. Score:
  its P(collapse within H); native: P >= 0.5 (it has no rule of its own).

Signals measured every k steps (attention) hold their last value until the next
measurement, as the seed's periodic check sees them. A measured non-finite loss or
gradient norm is an alarm for every rule (score +inf): no user would call it healthy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from collapse_guard.signals import signal

__all__ = [
    "RULE_BASELINES",
    "Baseline",
    "ConfigOnlyBaseline",
    "DSIBaseline",
    "KillLossSpikeBaseline",
    "OLMoZScoreBaseline",
    "ZClipBaseline",
    "default_baselines",
]


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name in frame:
        return frame[name].to_numpy(dtype=np.float64)
    return np.full(len(frame), np.nan)


def _measured_nonfinite(frame: pd.DataFrame, name: str) -> np.ndarray:
    # inf is always a measurement; NaN only when the companion flag says it was measured
    values = _column(frame, name)
    flag = _column(frame, f"{name}_nonfinite") if f"{name}_nonfinite" in frame else None
    bad = np.isinf(values)
    if flag is not None:
        bad |= np.isnan(values) & (flag >= 1)
    return bad


def _finite_losses(frame: pd.DataFrame) -> tuple[np.ndarray, pd.Series]:
    # the loss column, and the same with non-finite values left out (NaN) for statistics
    loss = _column(frame, "loss")
    return loss, pd.Series(np.where(np.isfinite(loss), loss, np.nan))


def _fires(score: np.ndarray, threshold: float) -> np.ndarray:
    # a native rule fires where its score is over the threshold; no opinion (NaN) never does
    return np.nan_to_num(score, nan=-np.inf) > threshold


class Baseline:
    """Interface of every baseline (see the module docstring)."""

    name: str = ""

    def fit(self, runs: Sequence, *, horizon: int = 200) -> Baseline:
        """Rules have nothing to fit; learned baselines override this."""
        return self

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        raise NotImplementedError

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray:
        raise NotImplementedError


def _band_exceedance(values: np.ndarray, name: str) -> np.ndarray:
    # > 0 outside the seed's band, < 0 inside, in units of the band (or threshold) size
    sig = signal(name)
    lo, hi = sig.low, sig.high
    scale = (hi - lo) if lo is not None and hi is not None else abs(hi if hi is not None else lo)
    above = (values - hi) / scale if hi is not None else np.full(values.shape, -np.inf)
    below = (lo - values) / scale if lo is not None else np.full(values.shape, -np.inf)
    return np.maximum(above, below)


class DSIBaseline(Baseline):
    """The seed's Dynamic Stability Index: all three DSI signals over threshold."""

    name = "dsi"
    signals = ("grad_cv", "attn_kl", "update_cos")

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        parts = []
        for name in self.signals:
            held = pd.Series(_column(frame, name)).ffill().to_numpy()
            parts.append(_band_exceedance(held, name))
        # all three over <=> the smallest exceedance is > 0; NaN until all were measured
        return np.min(np.vstack(parts), axis=0)

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray:
        return _fires(self.score_run(frame), 0.0)


class OLMoZScoreBaseline(Baseline):
    """OLMo-core's skip rule on the loss: one-sided z > 6 over the previous 128 losses.

    OLMo-core starts judging once it holds ``max(20, 128 // 2)`` losses and uses
    ``torch.std_mean`` (unbiased std). Non-finite losses are alarms here and are left
    out of the statistics (in OLMo one NaN poisons the window for 129 steps).
    """

    name = "olmo_zscore"
    window = 128
    sigma = 6.0
    min_history = 64

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        loss, finite = _finite_losses(frame)
        prev = finite.shift(1).rolling(self.window, min_periods=self.min_history)
        mean, std = prev.mean().to_numpy(), prev.std(ddof=1).to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (loss - mean) / std
        z = np.where(std == 0, np.where(loss > mean, np.inf, 0.0), z)
        return np.where(_measured_nonfinite(frame, "loss"), np.inf, z)

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray:
        return _fires(self.score_run(frame), self.sigma)


class ZClipBaseline(Baseline):
    """ZClip's spike detector on the gradient norm (Kumar et al., 2025).

    Warm-up: the first 25 norms set the mean and variance. Then, each step,
    z = (g - mean) / std; a spike is z > 2.5, and the norm is clipped to
    mean + (2.5^2 / z) * std (ZClip's reciprocal clipping) before it updates the EMA
    mean and variance (alpha 0.97), so one spike does not inflate the statistics.
    """

    name = "zclip"
    alpha = 0.97
    z_thresh = 2.5
    warmup = 25

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        g = _column(frame, "grad_norm")
        z_out = np.full(g.size, np.nan)
        history: list[float] = []
        mean = var = np.nan
        for i, gi in enumerate(g):
            if not np.isfinite(gi):
                continue  # unmeasured (NaN) or non-finite: set below, never fed to the EMA
            if len(history) < self.warmup:
                history.append(gi)
                if len(history) == self.warmup:
                    mean, var = float(np.mean(history)), float(np.var(history))
                continue
            std = np.sqrt(var)
            z = (gi - mean) / std if std > 0 else (np.inf if gi > mean else 0.0)
            z_out[i] = z
            clipped = mean + (self.z_thresh**2 / z) * std if z > self.z_thresh else gi
            mean = self.alpha * mean + (1 - self.alpha) * clipped
            var = self.alpha * var + (1 - self.alpha) * (clipped - mean) ** 2
        # an AMP overflow step (overflow = 1) is the scaler's business: it skips the step,
        # which is healthy behaviour; any other non-finite norm is a blow-up
        overflow = _column(frame, "overflow") >= 1
        blowup = _measured_nonfinite(frame, "grad_norm") & ~overflow
        return np.where(blowup, np.inf, z_out)

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray:
        return _fires(self.score_run(frame), self.z_thresh)


class KillLossSpikeBaseline(Baseline):
    """llm-foundry's KillLossSpike (window 100, multiplier 2, patience 4).

    The window holds the previous 100 losses (outliers included, as in llm-foundry);
    judging starts once it is full. The loss cap is the largest loss of the first
    full window; "high losses" is half of the window over the cap, from step
    2 x window on.
    """

    name = "kill_spike"
    window = 100
    multiplier = 2.0
    patience = 4

    def _ratio_and_high(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        loss, finite = _finite_losses(frame)
        prev = finite.shift(1)
        mean = prev.rolling(self.window, min_periods=self.window).mean().to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = loss / mean
        ratio = np.where(_measured_nonfinite(frame, "loss"), np.inf, ratio)
        high = np.zeros(loss.size, dtype=bool)
        first_window = finite.to_numpy()[: self.window]
        if loss.size > self.window and np.isfinite(first_window).any():
            cap = np.nanmax(first_window)
            over = (prev > cap).astype(float).rolling(self.window, min_periods=self.window).sum()
            high = over.to_numpy() >= self.window / 2
            high[: 2 * self.window] = False
        return ratio, high

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        ratio, _ = self._ratio_and_high(frame)
        # min over the last patience + 1 steps: score >= 2 <=> 5 outliers in a row
        run = pd.Series(ratio).rolling(self.patience + 1, min_periods=self.patience + 1).min()
        return run.to_numpy()

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray:
        score = np.nan_to_num(self.score_run(frame), nan=-np.inf)
        _, high = self._ratio_and_high(frame)
        return (score >= self.multiplier) | high


class ConfigOnlyBaseline(Baseline):
    """P(collapse within H) from what the config says: LR in force, step, peak LR so far."""

    name = "config_only"
    columns = ("log_lr", "step", "log_peak_lr")

    def __init__(self, random_state: int = 0) -> None:
        self.random_state = random_state

    def _features(self, frame: pd.DataFrame) -> pd.DataFrame:
        lr = pd.Series(_column(frame, "lr")).ffill()
        with np.errstate(divide="ignore"):
            log_lr = np.log10(lr.to_numpy())
            log_peak = np.log10(lr.cummax().to_numpy())
        return pd.DataFrame(
            {"log_lr": log_lr, "step": frame["step"].to_numpy(float), "log_peak_lr": log_peak}
        )

    def fit(self, runs: Sequence, *, horizon: int = 200, stride: int = 10) -> ConfigOnlyBaseline:
        """Fit on training runs (``RunRecord``s) at every ``stride``-th step before onset."""
        from collapse_guard.datasets.label import collapse_targets
        from collapse_guard.predictor.model import CollapsePredictor

        xs, ys = [], []
        for run in runs:
            steps = run.frame["step"].to_numpy()
            y, usable = collapse_targets(steps, run.meta.onset_step, horizon)
            rows = np.flatnonzero(usable)[::stride]
            xs.append(self._features(run.frame).iloc[rows])
            ys.append(np.asarray(y)[rows])
        # few, coarse features: a small model is all they can support
        self.model_ = CollapsePredictor(
            n_estimators=100, num_leaves=7, min_child_samples=50, random_state=self.random_state
        ).fit(pd.concat(xs, ignore_index=True), np.concatenate(ys))
        return self

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        if not hasattr(self, "model_"):
            raise RuntimeError("ConfigOnlyBaseline is not fitted; call fit(train_runs) first")
        return self.model_.raw_proba(self._features(frame))

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray:
        return self.score_run(frame) >= 0.5


RULE_BASELINES: tuple[type[Baseline], ...] = (
    DSIBaseline,
    OLMoZScoreBaseline,
    ZClipBaseline,
    KillLossSpikeBaseline,
)


def default_baselines(train_runs: Sequence | None = None, *, horizon: int = 200, seed: int = 0):
    """The four rules, plus config-only when ``train_runs`` are given to fit it on."""
    baselines: list[Baseline] = [cls() for cls in RULE_BASELINES]
    if train_runs:
        baselines.append(ConfigOnlyBaseline(random_state=seed).fit(train_runs, horizon=horizon))
    return baselines
