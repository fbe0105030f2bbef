"""What people use today, as :class:`~collapse_guard.predictor.evaluate.Scorer`s.

Each baseline gives, for every row of a run frame (``step`` + signal columns), a
continuous score (higher = more alarming, NaN = no opinion yet), so that it can also be
compared at a threshold fitted for the model's false-alarm rate; and its own operating
point, set without the test runs: a rule as its original fires it (``alarm_run``), a
learned baseline at a threshold tuned on validation runs (``operating_points``).

================  ===========================================================================
name              rule (source; defaults)
================  ===========================================================================
``dsi``           the seed's Dynamic Stability Index, at the seed's sampling periods: it
                  reads grad_cv every 100 steps, attn_kl every 50, update_cos every 10, and
                  alarms while all three last readings are over their thresholds (grad_cv >
                  0.45, attn_kl outside [0.2, 1.5], update_cos outside [0.1, 0.9]).
``olmo_zscore``   OLMo-core's ``SkipStepOptimizer`` (src/olmo_core/optim/
                  skip_step_optimizer.py, ``rolling_interval_length=128``,
                  ``sigma_factor=6``): skip when the loss *or* the gradient norm exceeds the
                  mean of the previous 128 values by more than 6 unbiased std, judging once
                  it holds ``max(2, 128 // 2) = 64`` losses, the current one included.
``zclip``         ZClip (bluorion-com/ZClip, zclip/zclip.py; ``alpha=0.97``,
                  ``z_thresh=2.5``, ``warmup_steps=25``, ``eps=1e-6``, ``zscore`` mode,
                  ``adaptive_scaling``): z of the gradient norm against an EMA mean and
                  variance set by the first 25 norms; a spike is z > 2.5, and the EMA is
                  updated with the clipped norm mean + 2.5 std / (z / 2.5).
``kill_spike``    llm-foundry's ``KillLossSpike`` (llmfoundry/callbacks/
                  kill_loss_spike_callback.py; ``patience=4``, ``outlier_multiplier=2``,
                  window ``max(100, 5% of the run)``, ``loss_cap=10``): the fifth loss in
                  a row >= 2x the window's mean, or half the window over the cap.
``attn_logit``    a threshold on the largest attention logit, tuned on validation runs.
``attn_entropy``  a threshold on the lowest attention entropy (alarm below), tuned the
                  same way.
``config_only``   what the config says, without any signal: a small LightGBM on the LR in
                  force, the step and the peak LR so far, fitted on the training runs;
                  threshold tuned on validation runs.
================  ===========================================================================

Conventions. Rows are steps: a rule's "previous 128 values" are the previous 128 rows
where the signal was measured. A measured non-finite loss or gradient norm is an alarm
for every rule (score +inf) and is left out of the statistics: in the originals a NaN
either fires (OLMo-core: every comparison with NaN fails, so the step is skipped) or
poisons the window for good (ZClip, KillLossSpike: a NaN mean never alarms again); no
user would call the step healthy. A signal measured every k steps (attention) holds its
last value until the next measurement, as a periodic check sees it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np
import pandas as pd

from collapse_guard.predictor.core.model import DEFAULT_STRIDE, CollapsePredictor
from collapse_guard.predictor.evaluate.events import threshold_at_budget
from collapse_guard.predictor.evaluate.report import scored_runs
from collapse_guard.runfiles.label import HORIZON, collapse_targets
from collapse_guard.signals import signal

__all__ = [
    "LEARNED_BASELINES",
    "RULE_BASELINES",
    "AttnEntropyThreshold",
    "AttnLogitThreshold",
    "Baseline",
    "ConfigOnlyBaseline",
    "DSIBaseline",
    "KillLossSpikeBaseline",
    "OLMoZScoreBaseline",
    "SignalThreshold",
    "ZClipBaseline",
    "default_baselines",
    "sampled",
]


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name in frame:
        return frame[name].to_numpy(dtype=np.float64)
    return np.full(len(frame), np.nan)


def _measured_nonfinite(frame: pd.DataFrame, name: str) -> np.ndarray:
    # inf is always a measurement; NaN only when the companion flag says it was measured
    values = _column(frame, name)
    bad = np.isinf(values)
    if f"{name}_nonfinite" in frame:
        bad |= np.isnan(values) & (_column(frame, f"{name}_nonfinite") >= 1)
    return bad


def _finite(values: np.ndarray) -> pd.Series:
    # the same values with non-finite ones left out (NaN), for statistics
    return pd.Series(np.where(np.isfinite(values), values, np.nan))


def _log10(values: np.ndarray) -> np.ndarray:
    # total: an LR of 0 (a warm-up from 0, as the transformers Trainer's) or below has no
    # logarithm and is left to the model as missing (NaN), never -inf, which LightGBM refuses
    positive = values > 0
    return np.log10(
        np.where(positive, values, 1.0), where=positive, out=np.full(values.shape, np.nan)
    )


def _fires(score: np.ndarray, threshold: float) -> np.ndarray:
    # a rule fires where its score is over the threshold; no opinion (NaN) never does
    return np.nan_to_num(score, nan=-np.inf) > threshold


class Baseline:
    """Shared defaults of every baseline: a rule has nothing to fit and no tuned point."""

    name: ClassVar[str] = ""
    probabilistic: ClassVar[bool] = False

    def fit(
        self,
        train_runs: Sequence = (),
        validation_runs: Sequence = (),
        *,
        horizon: int = HORIZON,
        budget_per_10k: float = 1.0,
    ) -> Baseline:
        """Rules have nothing to fit; learned baselines override this. Returns self."""
        return self

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        raise NotImplementedError

    def operating_points(self) -> Mapping[str, float]:
        return {}

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray | None:
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# ------------------------------------------------------------------------------ DSI


def _band_exceedance(values: np.ndarray, name: str) -> np.ndarray:
    # > 0 outside the seed's band, < 0 inside, in units of the band (or threshold) size
    sig = signal(name)
    lo, hi = sig.low, sig.high
    scale = (hi - lo) if lo is not None and hi is not None else abs(hi if hi is not None else lo)
    above = (values - hi) / scale if hi is not None else np.full(values.shape, -np.inf)
    below = (lo - values) / scale if lo is not None else np.full(values.shape, -np.inf)
    return np.maximum(above, below)


def sampled(frame: pd.DataFrame, name: str, period: int) -> np.ndarray:
    """What a check every ``period`` steps has read of ``name`` by each row's step.

    The check runs at steps 0, period, 2 x period, ...; at each it reads the latest
    measurement of the last ``period`` steps, (s - period, s], and holds it until the next
    check. NaN before the first reading (and after a check that found none).
    """
    steps = frame["step"].to_numpy(dtype=np.int64)
    values = _column(frame, name)
    measured = ~np.isnan(values)
    if not measured.any():
        return np.full(steps.size, np.nan)
    checks = pd.DataFrame({"check": (steps // period) * period})
    readings = pd.DataFrame({"at": steps[measured], "value": values[measured]})
    got = pd.merge_asof(
        checks,
        readings,
        left_on="check",
        right_on="at",
        direction="backward",
        tolerance=period - 1,
    )
    return got["value"].to_numpy(dtype=np.float64)


class DSIBaseline(Baseline):
    """The seed's Dynamic Stability Index at the seed's sampling periods (module docstring)."""

    name = "dsi"
    # the seed's sampling periods, in steps
    periods: ClassVar[dict[str, int]] = {"grad_cv": 100, "attn_kl": 50, "update_cos": 10}

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        parts = [
            _band_exceedance(sampled(frame, name, period), name)
            for name, period in self.periods.items()
        ]
        # all three over <=> the smallest exceedance is > 0; NaN until all were read
        return np.min(np.vstack(parts), axis=0)

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray:
        return _fires(self.score_run(frame), 0.0)


# ------------------------------------------------------------------------------ OLMo-core


class OLMoZScoreBaseline(Baseline):
    """OLMo-core's skip-step rule on the loss and the gradient norm (module docstring)."""

    name = "olmo_zscore"
    window = 128  # rolling_interval_length
    sigma = 6.0  # sigma_factor
    # OLMo judges once len(_losses) >= max(2, window // 2), and _losses holds the
    # current loss too: 63 previous values
    min_history = max(2, window // 2) - 1

    def _z(self, frame: pd.DataFrame, name: str) -> np.ndarray:
        values = _column(frame, name)
        prev = _finite(values).shift(1).rolling(self.window, min_periods=self.min_history)
        mean, std = prev.mean().to_numpy(), prev.std(ddof=1).to_numpy()  # torch.std_mean
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (values - mean) / std
        # std 0: OLMo's `x - mean <= 6 * 0` fails for any rise
        return np.where(std == 0, np.where(values > mean, np.inf, 0.0), z)

    def _parts(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        loss_z = self._z(frame, "loss")
        grad_z = self._z(frame, "grad_norm")
        # the gradient norm is judged on the loss's history count, as in OLMo-core
        grad_z = np.where(np.isnan(loss_z), np.nan, grad_z)
        blowup = _measured_nonfinite(frame, "loss") | _measured_nonfinite(frame, "grad_norm")
        return np.where(blowup, np.inf, loss_z), np.where(blowup, np.inf, grad_z)

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        loss_z, grad_z = self._parts(frame)
        return np.fmax(loss_z, grad_z)  # either signal skips; a missing one has no say

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray:
        loss_z, grad_z = self._parts(frame)
        return _fires(loss_z, self.sigma) | _fires(grad_z, self.sigma)


# ------------------------------------------------------------------------------ ZClip


class ZClipBaseline(Baseline):
    """ZClip's spike detector on the gradient norm (module docstring)."""

    name = "zclip"
    alpha = 0.97
    z_thresh = 2.5
    warmup = 25
    eps = 1e-6

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
                if len(history) == self.warmup:  # population mean and variance
                    mean, var = float(np.mean(history)), float(np.var(history))
                continue
            std = np.sqrt(var)
            z = (gi - mean) / (std + self.eps)
            z_out[i] = z
            clipped = mean + (self.z_thresh**2 / z) * std if z > self.z_thresh else gi
            mean = self.alpha * mean + (1 - self.alpha) * clipped
            var = self.alpha * var + (1 - self.alpha) * (clipped - mean) ** 2  # the new mean
        # an AMP overflow step (overflow = 1) is the scaler's business: it skips the step,
        # which is healthy behaviour; any other non-finite norm is a blow-up
        overflow = _column(frame, "overflow") >= 1
        blowup = _measured_nonfinite(frame, "grad_norm") & ~overflow
        return np.where(blowup, np.inf, z_out)

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray:
        return _fires(self.score_run(frame), self.z_thresh)


# ------------------------------------------------------------------------------ llm-foundry


class KillLossSpikeBaseline(Baseline):
    """llm-foundry's KillLossSpike (module docstring).

    The window holds the previous ``window`` losses, outliers included; judging starts
    once it is full. Window: ``max(100, round(0.05 x the run's steps))`` (the run's rows
    here). Loss cap: llm-foundry means it to be the first window's largest loss (at most
    10), but sets it only when ``current_step == window_size`` while the window is full,
    and Composer advances ``timestamp.batch`` before ``BATCH_END``, so when the window
    first fills the step is already window + 1: the cap stays at 10, as here. The
    high-loss test runs from Composer's step 2 x window, i.e. row 2 x window - 1.
    """

    name = "kill_spike"
    min_window = 100
    window_fraction = 0.05
    multiplier = 2.0
    patience = 4
    loss_cap = 10.0

    def window_for(self, n_steps: int) -> int:
        return max(self.min_window, round(n_steps * self.window_fraction))

    def _ratio_and_high(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        loss = _column(frame, "loss")
        window = self.window_for(len(frame))
        prev = _finite(loss).shift(1)
        mean = prev.rolling(window, min_periods=window).mean().to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(_measured_nonfinite(frame, "loss"), np.inf, loss / mean)
        over = (prev > self.loss_cap).astype(float).rolling(window, min_periods=window).sum()
        high = over.to_numpy() >= window / 2
        high[: 2 * window - 1] = False
        return ratio, high

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        ratio, _ = self._ratio_and_high(frame)
        # the smallest ratio of the last patience + 1 rows: >= 2 <=> 5 outliers in a row
        run = pd.Series(ratio).rolling(self.patience + 1, min_periods=self.patience + 1).min()
        # a measured non-finite loss alarms at once, whatever the four before it
        return np.where(_measured_nonfinite(frame, "loss"), np.inf, run.to_numpy())

    def alarm_run(self, frame: pd.DataFrame) -> np.ndarray:
        _, high = self._ratio_and_high(frame)
        return (np.nan_to_num(self.score_run(frame), nan=-np.inf) >= self.multiplier) | high


# ------------------------------------------------------------------------------ learned


class _Tuned(Baseline):
    """A baseline whose threshold is tuned on validation runs for a false-alarm budget."""

    def _tune(self, validation_runs: Sequence, horizon: int, budget_per_10k: float) -> None:
        if not validation_runs:
            self.threshold_ = None
            return
        scored = scored_runs(validation_runs, [self.score_run(r.frame) for r in validation_runs])
        self.threshold_ = threshold_at_budget(scored, budget_per_10k, horizon)

    def operating_points(self) -> dict[str, float]:
        threshold = getattr(self, "threshold_", None)
        return {} if threshold is None else {"native": threshold}


class SignalThreshold(_Tuned):
    """A single-signal threshold: alarm while the last reading of ``signal_name`` is past a
    value tuned on validation runs (``sign`` +1: above, -1: below)."""

    signal_name: ClassVar[str] = ""
    sign: ClassVar[float] = 1.0

    def fit(self, train_runs=(), validation_runs=(), *, horizon=HORIZON, budget_per_10k=1.0):
        self._tune(validation_runs, horizon, budget_per_10k)
        return self

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        held = pd.Series(_column(frame, self.signal_name)).ffill().to_numpy()
        return self.sign * held


class AttnLogitThreshold(SignalThreshold):
    name = "attn_logit"
    signal_name = "attn_logit_max"
    sign = 1.0


class AttnEntropyThreshold(SignalThreshold):
    name = "attn_entropy"
    signal_name = "attn_entropy_min"
    sign = -1.0  # a collapsing head's entropy falls


class ConfigOnlyBaseline(_Tuned):
    """P(collapse within H) from what the config says: LR in force, step, peak LR so far."""

    name = "config_only"
    probabilistic = True
    columns = ("log_lr", "step", "log_peak_lr")

    def __init__(self, random_state: int = 0, stride: int = DEFAULT_STRIDE) -> None:
        self.random_state = random_state
        self.stride = stride

    def _features(self, frame: pd.DataFrame) -> pd.DataFrame:
        # a non-finite LR is no reading of the config: the last finite one holds
        lr = pd.Series(_finite(_column(frame, "lr"))).ffill().to_numpy()
        peak = np.fmax.accumulate(lr)
        return pd.DataFrame(
            {
                "log_lr": _log10(lr),
                "step": frame["step"].to_numpy(float),
                "log_peak_lr": _log10(peak),
            }
        )

    def fit(self, train_runs=(), validation_runs=(), *, horizon=HORIZON, budget_per_10k=1.0):
        """Fit on training runs at every ``stride``-th step before onset; tune the threshold
        on validation runs."""
        if not train_runs:
            raise ValueError(
                "ConfigOnlyBaseline.fit needs training runs (RunRecords); got none. "
                "Fix: pass the runs the model was trained on"
            )
        xs, ys = [], []
        for run in train_runs:
            frame = run.frame  # read once: a stored run is read from its file
            y, usable = collapse_targets(frame["step"].to_numpy(), run.meta.onset_step, horizon)
            rows = np.flatnonzero(usable)[:: self.stride]
            xs.append(self._features(frame).iloc[rows])
            ys.append(np.asarray(y)[rows])
        # few, coarse features: a small model is all they can support
        self.model_ = CollapsePredictor(
            n_estimators=100, num_leaves=7, min_child_samples=50, random_state=self.random_state
        ).fit(pd.concat(xs, ignore_index=True), np.concatenate(ys))
        self._tune(validation_runs, horizon, budget_per_10k)
        return self

    def score_run(self, frame: pd.DataFrame) -> np.ndarray:
        if not hasattr(self, "model_"):
            raise RuntimeError("ConfigOnlyBaseline is not fitted; call fit(train_runs) first")
        return self.model_.raw_proba(self._features(frame))


RULE_BASELINES: tuple[type[Baseline], ...] = (
    DSIBaseline,
    OLMoZScoreBaseline,
    ZClipBaseline,
    KillLossSpikeBaseline,
)
LEARNED_BASELINES: tuple[type[Baseline], ...] = (AttnLogitThreshold, AttnEntropyThreshold)


def default_baselines(
    train_runs: Sequence | None = None,
    validation_runs: Sequence | None = None,
    *,
    horizon: int = HORIZON,
    budget_per_10k: float = 1.0,
    seed: int = 0,
) -> list[Baseline]:
    """The four rules; the tuned single-signal thresholds when ``validation_runs`` are given
    (they set the thresholds); config-only when ``train_runs`` are given to fit it on."""
    baselines: list[Baseline] = [cls() for cls in RULE_BASELINES]
    tune = {"horizon": horizon, "budget_per_10k": budget_per_10k}
    if validation_runs:
        baselines += [cls().fit((), validation_runs, **tune) for cls in LEARNED_BASELINES]
    if train_runs:
        config_only = ConfigOnlyBaseline(random_state=seed)
        baselines.append(config_only.fit(train_runs, validation_runs or (), **tune))
    return baselines
