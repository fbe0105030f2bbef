"""Line group: the loss along the step just taken, on the probe batch (issue 34, item 4).

An LR rise asks whether the run can absorb it: whether the loss still falls along the
update once the step grows. This group reads that where the optimizer stepped, whatever
made the step (AdamW, Lion, Muon, SGD or one it does not know). At each due step, with
``u`` the realised update (the parameters after the step minus before), ``b = g . u`` the
first-order change of the training batch's loss along it (``g`` read at
``after_backward``: before clipping, unscaled), and ``L(k)`` the probe batch's loss at
``theta + k u`` for k = 0, 1, 2 (three forwards: eval mode, no grad, the RNG forked)::

    c = (L(2) - 2 L(1) + L(0)) / 2        the curvature term along u: u^T H u / 2

=================  ==================================================================
key                meaning
=================  ==================================================================
``line_edge``      c / |b|. For gradient descent ``lr x`` the curvature along the
                   gradient ``/ 2``: 1 is its edge of stability (Cohen et al. 2021),
                   0.5 a step that lands on the minimum along ``u``; below 0 the loss
                   is concave along ``u``
``line_descent``   (L(0) - L(1)) / |b|: the share of the first-order decrease the step
                   realised on the probe batch (about 1 on a line, 0 at twice the
                   minimum's distance, below 0 a step that raised the probe loss)
``line_double``    (L(0) - L(2)) / |b|: the same for a step twice as long; below 0 a
                   doubled LR along this update would raise the loss (the "critical
                   sharpness" of arXiv 2601.16979, read at one multiple)
=================  ==================================================================

The consecutive-batch estimate (``stability_margin``) carries the two batches' gradient
noise; here the curvature comes from one batch at three points, and the first-order
term from the gradient the step was made from, so ``b`` is exact. NaN where the step did
not move (a skipped or overflowed step: ``b = 0``) and where no probe loss is at hand
(a model whose output holds no loss: one warning; ``Probe(loss_closure=fn)`` gives
one).

The group moves the parameters along ``u`` and puts them back from a copy, bit for bit:
training is untouched (``tests/probe/test_probe_line_search.py``). Cost, at each due step: a
copy of the parameters and the gradients at ``after_backward``, one of the parameters at
``after_step``, and three forwards of the probe batch (``probe_batch_size`` sequences),
1.6 % of a 6-layer d256 CPU step at period 10 (``benchmarks/probe_overhead.py``): off by
default (``line_every = 0``), on where runs are recorded as data. No model reads it: an
ablation inside LR rises found no gain (benchmarks/README.md, "The loss along the step").
"""

from __future__ import annotations

import warnings

import torch

from collapse_guard.probe.gradients import unscale_factor
from collapse_guard.probe.state import Event, ProbeState, SignalGroup

__all__ = ["LineSearchGroup", "line_readings"]


def line_readings(
    slope: torch.Tensor, losses: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The group's keys from ``b = g . u`` and the probe losses at k = 0, 1, 2."""
    at_0, at_1, at_2 = (loss.detach().double() for loss in losses)
    first_order = slope.double().abs()
    # 0 / 0 and x / 0 are NaN: a step that did not move has no line to read
    first_order = torch.where(first_order > 0, first_order, torch.nan)
    return {
        "line_edge": (at_2 - 2 * at_1 + at_0) / 2 / first_order,
        "line_descent": (at_0 - at_1) / first_order,
        "line_double": (at_0 - at_2) / first_order,
    }


class LineSearchGroup(SignalGroup):
    keys = ("line_edge", "line_descent", "line_double")
    period_field = "line_every"
    events = frozenset({Event.AFTER_BACKWARD, Event.AFTER_STEP})
    isolated = True  # its forwards: eval mode and a forked RNG (the probe gives both)

    def __init__(self, config=None) -> None:
        self._warned = False  # once per probe: reset() does not give the warning again
        super().__init__(config)

    def reset(self) -> None:
        super().reset()
        # (step, parameters before the step, their gradients): taken at after_backward
        self._before: tuple[int, list[torch.Tensor], list[torch.Tensor]] | None = None

    def update(self, state: ProbeState) -> LineSearchGroup:
        with torch.no_grad():
            if state.event is Event.AFTER_BACKWARD:
                self._before = (state.step, *self._snapshot(state))
            elif self._before is not None and self._before[0] == state.step:
                self._measure(state)
        return self

    @staticmethod
    def _snapshot(state: ProbeState) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        params = state.trainable()
        unscale = unscale_factor(state.scaler, state.optimizer)
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in params]
        if unscale is not None:
            grads = [g * unscale.to(g.device) for g in grads]
        else:
            grads = [g.clone() for g in grads]
        return [p.detach().clone() for p in params], grads

    def _measure(self, state: ProbeState) -> None:
        _, before, grads = self._before
        self._before = None
        if state.loss_closure is None:
            self._warn("no probe batch and no loss closure")
            return
        params = state.trainable()
        if not params:
            return
        after = [p.detach().clone() for p in params]
        step = torch._foreach_sub(after, before)
        slope = sum((g.double() * u.double()).sum() for g, u in zip(grads, step, strict=True))
        try:
            at_1 = state.loss_closure()
            self._place(params, before)
            at_0 = state.loss_closure()
            self._place(params, torch._foreach_add(after, step))
            at_2 = state.loss_closure()
        finally:
            self._place(params, after)  # the parameters the step made, bit for bit
        losses = (at_0, at_1, at_2)
        if not all(isinstance(x, torch.Tensor) and x.dim() == 0 for x in losses):
            self._warn(f"the probe batch's output holds no scalar loss ({type(at_1).__name__})")
            return
        self._values = line_readings(slope, losses)

    @staticmethod
    def _place(params: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        for param, value in zip(params, values, strict=True):
            param.copy_(value)

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"collapse-guard probe: {', '.join(self.keys)} are NaN: {why}. Set "
                "probe.loss_closure to a function returning a scalar loss on a small "
                "batch. This warning is given once.",
                RuntimeWarning,
                stacklevel=4,
            )
