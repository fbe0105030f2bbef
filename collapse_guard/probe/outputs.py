"""Output groups: what the loop hands the probe, and the model's predictions.

:class:`OutputGroup`, every ``output_every`` steps:

======================  ========================================================
key                     meaning
======================  ========================================================
``loss``                the loss given to ``after_backward`` (NaN if none)
``loss_nonfinite``      1 when that loss is NaN/inf, else 0 (the loss is kept)
``lr``                  ``optimizer.param_groups[0]["lr"]`` read after the step
``output_logit_max``    max |logit| over the step's training forwards, from a
                        forward hook on the logits layer (NaN without one)
======================  ========================================================

:class:`PredictionGroup`, on the probe batch, with the attention pass
(``attention_every`` steps):

======================  ========================================================
key                     meaning
======================  ========================================================
``output_entropy``      mean over positions of the entropy (nats) of the
                        predicted next-token distribution
``output_repetition``   share of positions whose argmax token is the most frequent
                        argmax token of the batch (1 = the model says one token)
======================  ========================================================
"""

from __future__ import annotations

import torch

from collapse_guard.probe.state import ProbeState, SignalGroup

__all__ = ["OutputGroup", "PredictionGroup"]


class OutputGroup(SignalGroup):
    keys = ("loss", "loss_nonfinite", "lr", "output_logit_max")
    period_field = "output_every"

    def update(self, state: ProbeState) -> OutputGroup:
        values: dict[str, torch.Tensor | float] = {"lr": state.lr}
        if state.loss is not None:
            loss = state.loss
            loss = loss.detach().float() if isinstance(loss, torch.Tensor) else torch.tensor(loss)
            values["loss"] = loss
            values["loss_nonfinite"] = (~torch.isfinite(loss)).float()
        if state.logit_max is not None:
            values["output_logit_max"] = state.logit_max
        self._values = values
        return self


class PredictionGroup(SignalGroup):
    keys = ("output_entropy", "output_repetition")
    period_field = "attention_every"

    def update(self, state: ProbeState) -> PredictionGroup:
        logits = state.probe_pass.logits if state.probe_pass else None
        if logits is None or logits.dim() < 2:
            return self
        logits = logits.reshape(-1, logits.size(-1))  # (positions, vocabulary)
        probs = torch.softmax(logits.float(), dim=-1)
        entropy = -torch.special.xlogy(probs, probs).sum(-1)  # xlogy: 0 log 0 = 0
        top = logits.argmax(dim=-1)
        modal = torch.bincount(top, minlength=logits.size(-1)).argmax()
        self._values = {
            "output_entropy": entropy.mean(),
            "output_repetition": (top == modal).float().mean(),
        }
        return self
