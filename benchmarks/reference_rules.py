"""Other projects' stability rules, as the rescue benchmark runs them beside the guard.

Each class is one rule written after its original, with the original's defaults; the
benchmark (``guard_rescue.py``: the ``olmo``, ``zclip`` and ``qk_alone`` arms) puts it in
the same training loop as the guard, so the arms differ only by the rule. The
predictor's score baselines of the same rules are ``collapse_guard.predictor.evaluate.
baselines`` (a rule read as an alarm, not acting on the run).

==============  ======================================================================
class           the rule, and where it comes from
==============  ======================================================================
``OLMoSkip``    OLMo-core's ``SkipStepOptimizer`` (allenai/OLMo-core,
                ``src/olmo_core/optim/skip_step_optimizer.py``): skip the update when
                |z| of the loss or of the pre-clip gradient norm against the previous
                values (128-step window, judged from 64 values) exceeds 6
``ZClip``       ZClip (bluorion-com/ZClip, ``zclip/zclip.py``): EMA alpha 0.97, z 2.5,
                25 warm-up norms, ``zscore`` mode, ``adaptive_scaling``
``KimiClip``    QK-clip alone, Kimi K2's rule (MuonClip, arXiv 2507.20534; Megatron-Core's
                ``optimizer/qk_clip.py``): no forecast, no reactive path; at each probe
                pass the heads whose largest pre-softmax logit passed tau are scaled
==============  ======================================================================
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["QK_TAU", "KimiClip", "OLMoSkip", "ZClip"]

QK_TAU = 100.0  # Kimi K2's and Megatron-Core's tau


class OLMoSkip:
    """OLMo-core's skip-step rule (module docstring); ``keep(loss, norm)`` -> apply?"""

    window, sigma = 128, 6.0

    def __init__(self) -> None:
        self.losses: deque[float] = deque(maxlen=self.window + 1)
        self.norms: deque[float] = deque(maxlen=self.window + 1)

    @staticmethod
    def _z(values: deque) -> float:
        *prev, now = values
        mean = sum(prev) / len(prev)
        std = math.sqrt(sum((v - mean) ** 2 for v in prev) / (len(prev) - 1))
        return abs(now - mean) / std if std > 0 else (0.0 if now == mean else math.inf)

    def keep(self, loss: float, norm: float) -> bool:
        self.losses.append(loss)
        self.norms.append(norm)
        if len(self.losses) < max(20, self.window // 2):
            return True
        # NaN compares False: OLMo-core skips a non-finite step
        return self._z(self.losses) <= self.sigma and self._z(self.norms) <= self.sigma


class ZClip:
    """ZClip's ``zscore`` / ``adaptive_scaling`` clipping (module docstring)."""

    alpha, z_thresh, warmup, eps = 0.97, 2.5, 25, 1e-6

    def __init__(self, max_norm: float | None) -> None:
        self.max_norm = max_norm
        self.buffer: list[float] = []
        self.mean = self.var = None
        self.spikes = 0

    def bound(self, norm: float) -> float | None:
        """The clipping bound for this step's norm (None: none), updating the EMA."""
        if self.mean is None:
            self.buffer.append(norm)
            if len(self.buffer) >= self.warmup:
                self.mean = sum(self.buffer) / len(self.buffer)
                self.var = sum((x - self.mean) ** 2 for x in self.buffer) / len(self.buffer)
            return self.max_norm
        std = self.var**0.5
        z = (norm - self.mean) / (std + self.eps)
        clip = self.mean + self.z_thresh * std / (z / self.z_thresh) if z > self.z_thresh else None
        self.spikes += clip is not None
        effective = clip if clip is not None else norm
        if self.max_norm is not None:
            effective = min(effective, self.max_norm)
        seen = clip if clip is not None else norm
        self.mean = self.alpha * self.mean + (1 - self.alpha) * seen
        self.var = self.alpha * self.var + (1 - self.alpha) * (seen - self.mean) ** 2
        return effective


class KimiClip:
    """QK-clip alone (the ``qk_alone`` arm): the probe's attention pass gives each head's
    largest pre-softmax logit; the heads over tau are clipped right after that pass."""

    def __init__(self, net, optimizer, tau: float = QK_TAU) -> None:
        from collapse_guard.guard.qk_clip import QKClip
        from collapse_guard.probe import Probe

        self.probe, self.qk, self.clips = Probe(net, optimizer), QKClip(net, tau), 0

    def after_step(self) -> None:
        self.probe.after_step()
        if self.probe.last_pass is not None:
            self.clips += len(self.qk.apply(self.qk.plan(self.probe.last_pass.attention)))
