"""Update group: parameter updates seen through a fixed random sketch.

Each trainable tensor contributes ``sketch_size`` coordinates (all of them when it is
smaller), drawn once with the probe's own ``torch.Generator`` so the global RNG is not
consumed. The sketch is read before the step (at ``after_backward``) and after it
(``after_step``); their difference is the step's update ``u`` restricted to the
sketch, without a second copy of the model.

=================  ===========================================================
key                meaning
=================  ===========================================================
``update_cos``     cosine of this update with the previous one, over the whole
                   sketch; NaN when either is zero (a skipped step is not an
                   update: the previous non-zero one stays the reference)
``update_flips``   max over tensors of the number of sign reversals in the last
                   ``flip_window`` measured steps. A reversal of tensor i at step
                   t: the projection of u_t^i on u_{t-1}^i is negative
                   (<u_t^i, u_{t-1}^i> < 0), i.e. the tensor moved back
``update_ratio``   max over weight tensors (>= 2 dims: matrices, embeddings) of
                   ||u^i|| / ||param^i|| on the sketch, param after the step;
                   biases and norm gains start at 0 or 1 and would dominate
``param_norm``     global L2 norm of all trainable parameters (exact)
=================  ===========================================================
"""

from __future__ import annotations

import math

import torch

from collapse_guard.probe.gradients import float32_norms
from collapse_guard.probe.state import Event, ProbeState, SignalGroup

__all__ = ["SketchedGroup", "UpdateGroup"]

# On the CPU the flat gather (one copy of every parameter, then one index_select) beats
# one index_select a tensor while the tensors are this small on average: measured with
# the caches cold, as after a training step, 0.23 against 0.35 ms on the demo's 2x64
# (4.7k coordinates a tensor), even on the nanoGPT-shaped 2x128 (14.5k), 2.6x slower on
# the 6x256 (64k)
_FLAT_CPU_MEAN_NUMEL = 8192


class SketchedGroup(SignalGroup):
    """Base of the groups that read tensors shaped like the parameters (the parameters,
    their gradients, optimizer state) at the sketch's coordinates: the same coordinates
    for every such group, since they are drawn from ``sketch_seed`` alone."""

    def reset(self) -> None:
        super().reset()
        self._param_ids: tuple[int, ...] = ()
        self._index: list[torch.Tensor | None] = []  # per tensor: sketch coordinates
        self._flat_index: torch.Tensor | None = None  # the same, into the concatenation
        self._mixed = False  # parameters on several devices or of several dtypes
        self._segment: torch.Tensor | None = None  # sketch position -> tensor number
        self._weights: torch.Tensor | None = None  # tensor numbers of the weight matrices

    def _setup(self, params: list[torch.nn.Parameter]) -> bool:
        """Choose the sketch coordinates; forget history if the parameter set changed.
        Returns True when it did (a subclass then sets up its own history)."""
        ids = tuple(id(p) for p in params)
        if ids == self._param_ids:
            return False
        self.reset()
        self._param_ids = ids
        generator = torch.Generator().manual_seed(self.config.sketch_seed)
        size, segments = self.config.sketch_size, []
        device = params[0].device
        host_index = []  # the same on the host: the flat index is built from these
        for number, p in enumerate(params):
            if p.numel() <= size:
                host_index.append(None)
                segments.append(torch.full((p.numel(),), number))
            else:
                # with replacement: randint is O(size), randperm would be O(numel)
                host_index.append(torch.randint(p.numel(), (size,), generator=generator))
                segments.append(torch.full((size,), number))
        pairs = zip(host_index, params, strict=True)
        self._index = [i if i is None else i.to(p.device) for i, p in pairs]
        self._segment = torch.cat(segments).to(device)
        self._lengths = torch.tensor([len(x) for x in segments], device=device)
        self._mixed = len({(p.device, p.dtype) for p in params}) != 1
        small = sum(p.numel() for p in params) <= _FLAT_CPU_MEAN_NUMEL * len(params)
        flat = device.type != "cpu" or small
        self._flat_index = self._flat(params, host_index) if flat else None
        # biases and norm gains start at 0 or 1: ratios to them would dominate
        weights = [n for n, p in enumerate(params) if p.dim() >= 2] or list(range(len(params)))
        self._weights = torch.tensor(weights, device=device)
        return True

    def _sketch(self, params: list[torch.Tensor]) -> torch.Tensor:
        """The sketch's coordinates of ``params`` (or of tensors shaped like them, one
        for each), as one float32 vector.

        On an accelerator, and on the CPU for small tensors (``_FLAT_CPU_MEAN_NUMEL``),
        one gather over one flat index into the concatenated parameters: two kernels
        whatever the number of tensors (a launch costs more than the copy there). On the
        CPU with larger tensors, where the copy is the cost, one ``index_select`` per
        tensor: 0.38 ms against 4.7 ms for the 6-layer d256 model's 77 tensors.
        """
        flats = [p.reshape(-1) for p in params]  # update() runs under no_grad: no graph
        if self._flat_index is not None:
            return torch.cat(flats).index_select(0, self._flat_index).float()
        parts = [
            flat if index is None else flat.index_select(0, index)
            for flat, index in zip(flats, self._index, strict=True)
        ]
        if self._mixed:  # several devices or dtypes: each part to the sketch's own
            parts = [part.to(self._segment.device, torch.float32) for part in parts]
        return torch.cat(parts).float()

    def _param_sketch(self, state: ProbeState, params: list[torch.nn.Parameter]) -> torch.Tensor:
        """``_sketch(params)`` at this event, shared with the other sketched groups of the
        probe (one gather, not one a group; nobody changes a sketch in place)."""
        key = (self.config.sketch_seed, self.config.sketch_size, self._param_ids)
        if key not in state.sketches:
            state.sketches[key] = self._sketch(params)
        return state.sketches[key]

    def _flat(self, params: list[torch.nn.Parameter], host_index: list) -> torch.Tensor | None:
        """The sketch's positions in the parameters laid end to end (None unless every
        tensor lies on one device with one dtype: the concatenation needs both), built
        from the host's copies of the per-tensor indices (no read from the device)."""
        if self._mixed:
            return None
        parts, offset = [], 0
        for p, index in zip(params, host_index, strict=True):
            at = torch.arange(p.numel()) if index is None else index
            parts.append(at + offset)
            offset += p.numel()
        return torch.cat(parts).to(params[0].device)

    def _per_tensor(self, values: torch.Tensor) -> torch.Tensor:
        if values.device.type == "cpu":
            # the sketch holds each tensor's coordinates as one run: a segment sum, 3x
            # faster than index_add_ over the segment ids here, and the same bits
            return torch.segment_reduce(values, "sum", lengths=self._lengths)
        # on a GPU index_add_ is one kernel that never reads the lengths on the host
        n = len(self._lengths)
        return torch.zeros(n, device=values.device).index_add_(0, self._segment, values)


class UpdateGroup(SketchedGroup):
    keys = ("update_cos", "update_flips", "update_ratio", "param_norm")
    period_field = "update_every"
    events = frozenset({Event.AFTER_BACKWARD, Event.AFTER_STEP})

    def reset(self) -> None:
        super().reset()
        self._before: tuple[int, torch.Tensor] | None = None  # (step, sketch before it)
        self._last: torch.Tensor | None = None  # sketch after the last measured step
        self._previous: torch.Tensor | None = None  # last non-zero update, per tensor
        self._previous_norm: torch.Tensor | None = None  # its norm, where already known
        self._flips: torch.Tensor | None = None  # (flip_window, tensors) reversal flags
        self._count = 0  # measured updates so far (ring position of _flips)

    def _setup(self, params: list[torch.nn.Parameter]) -> bool:
        if not super()._setup(params):
            return False
        self._flips = torch.zeros(self.config.flip_window, len(params), device=params[0].device)
        return True

    def _reference(
        self, update: torch.Tensor, update_norm: torch.Tensor, norm: torch.Tensor, host_reads: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next step's reference update and its norm (None: not known yet). A tensor
        that did not move keeps its last real update as the reference. On the CPU, asking
        whether every tensor moved is free: then the reference is ``update`` itself, whose
        norm is ``norm`` (the same bits), and neither a select over the sketch nor the next
        step's norm of the reference is needed."""
        moved = update_norm > 0
        if host_reads and update.device.type == "cpu" and bool(moved.all()):
            return update, norm
        return torch.where(moved.index_select(0, self._segment), update, self._previous), None

    @torch.no_grad()
    def update(self, state: ProbeState) -> UpdateGroup:
        params = state.trainable()
        if not params:
            return self
        self._setup(params)
        sketch = self._param_sketch(state, params)
        if state.event is Event.AFTER_BACKWARD:
            self._before = (state.step, sketch)
            return self
        before = self._before[1] if self._before and self._before[0] == state.step else self._last
        self._before, self._last = None, sketch
        norms = float32_norms(params)
        if any(n.device != sketch.device for n in norms):
            norms = [n.to(sketch.device) for n in norms]
        values: dict[str, torch.Tensor | float] = {
            "param_norm": torch.stack(norms).square().sum().sqrt()
        }
        if before is None:  # first measured step and no sketch from before it
            self._values = values
            return self
        n = len(params)
        update = sketch - before
        update_norm = self._per_tensor(update.square()).sqrt()
        param_norm = self._per_tensor(sketch.square()).sqrt()
        ratio = torch.where(param_norm > 0, update_norm / param_norm, 0.0)
        values["update_ratio"] = ratio.index_select(0, self._weights).amax()

        if self._previous is None:
            reversed_ = torch.zeros(n, device=update.device)
            values["update_cos"] = math.nan
            self._previous, self._previous_norm = update, None
        else:
            dot = self._per_tensor(update * self._previous)
            reversed_ = (dot < 0).float()
            norm_now = update.norm()
            norm_before = self._previous_norm
            if norm_before is None:
                norm_before = self._previous.norm()
            both = (norm_now > 0) & (norm_before > 0)
            cos = dot.sum() / (norm_now * norm_before).clamp_min(1e-30)
            values["update_cos"] = torch.where(both, cos, math.nan)
            self._previous, self._previous_norm = self._reference(
                update, update_norm, norm_now, state.host_reads
            )
        self._flips[self._count % self.config.flip_window] = reversed_
        self._count += 1
        values["update_flips"] = self._flips.sum(dim=0).amax()
        self._values = values
        return self
