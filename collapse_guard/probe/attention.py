"""Attention group: statistics of every attention head on the fixed probe batch.

The probe pass (``capture.run_probe_pass``) hands over one :class:`AttentionCapture`
per attention call. A "head" is one (call, head) pair; per-head quantities are
averaged over the probe batch's sequences and query positions.

======================  ========================================================
key                     meaning
======================  ========================================================
``attn_entropy_min``    smallest per-head mean row entropy, nats (a uniform row
                        over T keys has log T; causal rows see i + 1 keys)
``attn_entropy_mean``   mean per-head entropy, nats
``attn_kl``             mean over heads of KL(P_now || P_previous probe), each
                        head's KL the mean over rows; NaN at the first probe or
                        when the set of calls/shapes changed
``attn_saturation``     fraction of heads whose outputs are near-identical across
                        tokens: for each sequence, the mean pairwise cosine over
                        token pairs i != j of the head's output vectors, averaged
                        over sequences, exceeds ``saturation_cos`` (0.95). Uniform
                        attention over all keys makes every token's output the
                        same mean value vector: saturation 1
``attn_logit_max``      largest unmasked pre-softmax logit (scaled, mask added)
======================  ========================================================

All NaN when the model's attention could not be reached (no SDPA, no
``nn.MultiheadAttention``, no ``attention_fn``).
"""

from __future__ import annotations

import math

import torch

from collapse_guard.probe.capture import AttentionCapture
from collapse_guard.probe.state import ProbeState, SignalGroup

__all__ = ["AttentionCapture", "AttentionGroup", "head_similarity"]


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    """Per-head mean row entropy: (batch, heads, queries, keys) -> (heads,)."""
    return -torch.special.xlogy(probs, probs).sum(-1).mean(dim=(0, 2))


def _kl(now: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """Per-head mean row KL(now || before); both share their masks, so 0 stays 0."""
    tiny = torch.finfo(now.dtype).tiny
    log_ratio = now.clamp_min(tiny).log() - before.clamp_min(tiny).log()
    return (now * log_ratio).sum(-1).mean(dim=(0, 2))


def head_similarity(outputs: torch.Tensor) -> torch.Tensor:
    """Mean pairwise cosine of token outputs, per head: (batch, heads, T, d) -> (heads,).

    With unit vectors n_i, sum_{i != j} n_i . n_j = ||sum_i n_i||^2 - sum_i ||n_i||^2,
    so the mean over the T (T - 1) ordered pairs costs O(T d), not O(T^2 d). A zero
    output vector counts as cosine 0 with everything.
    """
    tokens = outputs.size(-2)
    if tokens < 2:
        return torch.full((outputs.size(1),), math.nan, device=outputs.device)
    unit = torch.nn.functional.normalize(outputs.float(), dim=-1)
    total = unit.sum(dim=-2).square().sum(-1) - unit.square().sum(dim=(-2, -1))
    return (total / (tokens * (tokens - 1))).mean(dim=0)


class AttentionGroup(SignalGroup):
    keys = (
        "attn_entropy_min",
        "attn_entropy_mean",
        "attn_kl",
        "attn_saturation",
        "attn_logit_max",
    )
    period_field = "attention_every"

    def reset(self) -> None:
        super().reset()
        self._previous: list[torch.Tensor] | None = None

    def update(self, state: ProbeState) -> AttentionGroup:
        captures: list[AttentionCapture] = state.probe_pass.attention if state.probe_pass else []
        if not captures:
            return self
        entropy = torch.cat([_entropy(c.probs) for c in captures])
        values: dict[str, torch.Tensor | float] = {
            "attn_entropy_min": entropy.amin(),
            "attn_entropy_mean": entropy.mean(),
        }
        now = [c.probs for c in captures]
        previous, self._previous = self._previous, now
        if previous is not None and [p.shape for p in previous] == [p.shape for p in now]:
            kl = [_kl(a, b) for a, b in zip(now, previous, strict=True)]
            values["attn_kl"] = torch.cat(kl).mean()
        if all(c.outputs is not None for c in captures):
            similarity = torch.cat([head_similarity(c.outputs) for c in captures])
            saturated = (similarity > self.config.saturation_cos).float()
            values["attn_saturation"] = saturated.mean()
        if all(c.logit_max is not None for c in captures):
            values["attn_logit_max"] = torch.stack([c.logit_max for c in captures]).amax()
        self._values = values
        return self
