"""Gradient group: one pass over the gradients, before any clipping.

====================  =========================================================
key                   meaning
====================  =========================================================
``grad_norm``         global L2 norm of all gradients (unscaled under AMP)
``grad_cv``           coefficient of variation (population std / mean) of the
                      per-layer gradient norms; a "layer" is a transformer block
                      when blocks were found, else a parameter tensor of >= 2 dims;
                      NaN with fewer than two layers
``bottom_grad_norm``  gradient norm of the lowest transformer block (0 when the
                      block is frozen or got no gradient; NaN with no block)
``grad_nonfinite``    number of NaN/inf gradient elements
====================  =========================================================

Per-tensor norms come from ``torch._foreach_norm`` (one fused kernel per device and
dtype); everything stays on the device until the probe's single sync. The per-tensor
norms stay on as ``tensor_norms`` for the step: the guard clips and keeps its gradient
history from them, so a guarded step makes one pass over the gradients, not two.
"""

from __future__ import annotations

import math

import torch

from collapse_guard.probe.state import Event, ProbeState, SignalGroup

__all__ = ["GradientGroup", "float32_norms", "unscale_factor"]


def float32_norms(tensors: list[torch.Tensor], order: float = 2) -> list[torch.Tensor]:
    """Each tensor's norm as a float32 0-d tensor, in one fused kernel where it can be:
    ``dtype=float32`` would narrow a float64 tensor, which torch refuses."""
    if any(t.dtype == torch.float64 for t in tensors):
        return [n.float() for n in torch._foreach_norm(tensors, order)]
    return list(torch._foreach_norm(tensors, order, dtype=torch.float32))


def unscale_factor(scaler: object, optimizer: object) -> torch.Tensor | None:
    """1 / the GradScaler's scale as a device tensor; None without AMP or once unscaled."""
    if scaler is None or not scaler.is_enabled():
        return None
    stage = scaler._per_optimizer_states.get(id(optimizer), {}).get("stage")
    if getattr(stage, "name", "") == "UNSCALED":  # the loop called scaler.unscale_ already
        return None
    scale = getattr(scaler, "_scale", None)  # device tensor: reading it costs no sync
    if scale is None:  # the scaler has not scaled anything yet
        return None
    return scale.double().reciprocal().float()


def _unscaler(unscale: torch.Tensor | None, device: torch.device):
    """``x -> x * unscale`` on ``device``; without AMP the identity (x * 1.0 is x, bit for
    bit: no op to dispatch)."""
    if unscale is None:
        return lambda x: x
    factor = unscale.to(device)
    return lambda x: x * factor


class GradientGroup(SignalGroup):
    keys = ("grad_norm", "grad_cv", "bottom_grad_norm", "grad_nonfinite")
    period_field = "gradient_every"
    events = frozenset({Event.AFTER_BACKWARD})

    def reset(self) -> None:
        super().reset()
        self._layout_key: tuple | None = None
        self._layer_of: dict[int, int] = {}  # id(param) -> layer index
        self._n_layers = 0
        self._bottom_ids: frozenset[int] = frozenset()
        self._index_key: tuple | None = None
        self._index_cache: tuple = (None, None)
        # this step's per-tensor gradient norms (unscaled; 0 without a gradient), or None
        self.tensor_norms: torch.Tensor | None = None
        self._spread_key: tuple | None = None
        self._spread_index: torch.Tensor | None = None

    def _layout(self, state: ProbeState, params: list[torch.nn.Parameter]) -> None:
        key = (tuple(id(b) for b in state.blocks), id(state.bottom_block), len(params))
        if key == self._layout_key:
            return
        self._layout_key = key
        if len(state.blocks) >= 2:
            self._layer_of = {
                id(p): i for i, block in enumerate(state.blocks) for p in block.parameters()
            }
        else:
            matrices = [p for p in params if p.dim() >= 2]
            self._layer_of = {id(p): i for i, p in enumerate(matrices)}
        self._n_layers = len(set(self._layer_of.values()))
        bottom = state.bottom_block
        self._bottom_ids = frozenset(id(p) for p in bottom.parameters()) if bottom else frozenset()

    def update(self, state: ProbeState) -> GradientGroup:
        params = state.trainable()
        self._layout(state, params)
        with_grad = [p for p in params if p.grad is not None]
        self.tensor_norms = None
        if not with_grad:
            self._values = {"bottom_grad_norm": math.nan if state.bottom_block is None else 0.0}
            return self
        grads = [p.grad.coalesce().values() if p.grad.is_sparse else p.grad for p in with_grad]
        device = grads[0].device
        norms = float32_norms(grads)
        stacked = torch.stack(norms if self._one_device(norms) else [n.to(device) for n in norms])
        squares = stacked.square()
        unscale = unscale_factor(state.scaler, state.optimizer)
        self.tensor_norms = self._spread(stacked if unscale is None else stacked * unscale, params)
        unscaled = _unscaler(unscale, device)

        total = squares.sum().sqrt()
        values: dict[str, torch.Tensor | float] = {
            "grad_norm": unscaled(total),
            "grad_nonfinite": self._nonfinite(grads, total, state.host_reads),
        }
        layer_index, bottom_index = self._indices(with_grad, device)
        if layer_index is not None:
            # the scale cancels in std/mean, so the CV needs no unscaling
            n_slots = self._n_layers + 1
            per_layer = torch.zeros(n_slots, device=device).index_add_(0, layer_index[0], squares)
            per_layer = per_layer.index_select(0, layer_index[1]).sqrt()
            values["grad_cv"] = per_layer.std(correction=0) / per_layer.mean()
        if state.bottom_block is not None:
            bottom = squares.index_select(0, bottom_index).sum().sqrt()
            values["bottom_grad_norm"] = unscaled(bottom)
        self._values = values
        return self

    @staticmethod
    def _one_device(norms: list[torch.Tensor]) -> bool:
        first = norms[0].device
        return all(n.device == first for n in norms)

    def _spread(self, stacked: torch.Tensor, params: list[torch.nn.Parameter]) -> torch.Tensor:
        """Per-tensor norms over every trainable tensor, 0 where a tensor got no gradient
        (the guard's clipping and gradient history share this pass instead of a second)."""
        if len(stacked) == len(params):
            return stacked
        key = (tuple(p.grad is not None for p in params), stacked.device)
        if key != self._spread_key:  # cached: a host-to-device copy a step would sync a GPU
            present = [i for i, p in enumerate(params) if p.grad is not None]
            self._spread_key = key
            self._spread_index = torch.tensor(present, device=stacked.device)
        return stacked.new_zeros(len(params)).index_copy_(0, self._spread_index, stacked)

    @staticmethod
    def _nonfinite(
        grads: list[torch.Tensor], total: torch.Tensor, host_reads: bool
    ) -> torch.Tensor | float:
        """Count NaN/inf gradient elements.

        A finite norm means every element is finite. On the CPU, asking the norm first
        is free (no device to sync with) and skips a pass over every gradient, unless the
        caller wants no host read before the record (``host_reads``: the guard's deferred
        facts). Otherwise the count runs on the device in two fused passes: ``g * 0`` is 0
        where ``g`` is finite and NaN elsewhere, and the 0-norm counts the non-zeros.
        """
        if host_reads and total.device.type == "cpu" and bool(torch.isfinite(total)):
            return 0.0
        counts = float32_norms(torch._foreach_mul(grads, 0.0), order=0)
        return torch.stack([c.to(total.device) for c in counts]).sum()

    def _indices(
        self, with_grad: list[torch.nn.Parameter], device: torch.device
    ) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, torch.Tensor]:
        """Index tensors for the per-layer and bottom-block sums, cached by the grad set.

        Built on the host and cached: a fresh host-to-device copy every step would be a
        sync point on a GPU.
        """
        key = (self._layout_key, tuple(id(p) for p in with_grad), device)
        if key == self._index_key:
            return self._index_cache
        other = self._n_layers  # slot for tensors outside every layer
        layer = [self._layer_of.get(id(p), other) for p in with_grad]
        present = sorted(set(layer) - {other})  # layers with no gradient at all are left out
        layer_index = None
        if len(present) >= 2:
            layer_index = (
                torch.tensor(layer, device=device),
                torch.tensor(present, device=device),
            )
        bottom = [i for i, p in enumerate(with_grad) if id(p) in self._bottom_ids]
        bottom_index = torch.tensor(bottom, dtype=torch.long, device=device)
        self._index_key, self._index_cache = key, (layer_index, bottom_index)
        return self._index_cache
