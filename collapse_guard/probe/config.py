"""The probe's settings: one flat dataclass, each default with its unit and reason.

A period is a number of optimizer steps between measurements: a group is measured at
step ``s`` when ``period > 0 and s % period == 0`` (steps count from 0), and reports
NaN at the other steps. ``0`` turns a group off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from collapse_guard._config import reject_unknown_keys

__all__ = ["RECORDED_LINE_EVERY", "RECORDED_OPTIMIZER_EVERY", "ProbeConfig"]

# the optimizer-state group's period where runs are recorded as data (``collapse-guard data
# real``): off in a user's loop (no model reads it yet), on in the corpus, so that the
# ablation that would keep it has the runs
RECORDED_OPTIMIZER_EVERY = 10
# the line group's, likewise: three probe-batch forwards and copies of the parameters a due
# step, a few percent of a small model's run at 10 (benchmarks/probe_overhead.py)
RECORDED_LINE_EVERY = 10


@dataclass
class ProbeConfig:
    """Settings of :class:`collapse_guard.probe.Probe`; unknown keys are an error."""

    # --- periods, in optimizer steps (0 = off) ---
    gradient_every: int = 1  # one pass over the gradients: cheap, and collapse can take one step
    update_every: int = 1  # two small gathers from the sketch: cheap
    output_every: int = 1  # loss, lr, output logit max, AMP scale: already on hand
    attention_every: int = 10  # one forward of the probe batch (+ output entropy/repetition);
    # every 10 steps, not 50: entropy collapse can fall from 1.3 to 0.01 nats in 40 steps
    # (the demo run), and the 6x256 benchmark model pays 2.3% of step time at 10 against
    # 1.5% at 50 (benchmarks/probe_overhead.py, loaded 2-core machine, 2026-11-30)
    optimizer_every: int = 0  # off: optimizer state at the sketch, at the due step and the
    # one before it (the stability margin compares their gradients), ~9 sketch gathers a
    # pair: 0.14 % of a 6x256 step at 10, but 35-100 % of the README's 2-layer GPT's tiny
    # step (fixed costs per tensor); no model reads it yet (training.data.MODEL_SIGNALS)
    line_every: int = 0  # off: the loss along the step on the probe batch (three forwards,
    # copies of the parameters and gradients); no model reads it yet (MODEL_SIGNALS)
    system_every: int = 100  # reads /proc and NVML: host calls, no need to be frequent
    sharpness_every: int = 0  # off: power iteration costs ~2 x sharpness_iters backward passes

    # --- update sketch ---
    sketch_size: int = 2048  # coordinates kept per parameter tensor (all of them if fewer)
    sketch_seed: int = 0  # seeds the probe's own generator: the global RNG is never consumed
    flip_window: int = 10  # steps over which update sign reversals are counted (the seed's 10)

    # --- probe batch (attention group) ---
    probe_batch_size: int = 2  # sequences kept from the first training batch: a couple suffice
    probe_seq_len: int = 128  # token-id inputs are cropped to this many positions: bounds the
    # memory of the stored previous attention (layers x heads x T^2 floats)
    saturation_cos: float = 0.95  # a head is saturated when its token outputs' mean pairwise
    # cosine exceeds this (the seed's 0.95)

    # --- sharpness ---
    sharpness_iters: int = 20  # power-iteration steps; each is one Hessian-vector product

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(value, int) or value < 0):
                raise ValueError(
                    f"ProbeConfig.{f.name} must be a non-negative int, got {value!r}; "
                    "periods use 0 for off"
                )
        for name in ("sketch_size", "flip_window", "probe_batch_size", "probe_seq_len"):
            if getattr(self, name) == 0:
                raise ValueError(f"ProbeConfig.{name} must be at least 1, got 0")
        if self.sharpness_every and self.sharpness_iters == 0:
            raise ValueError(
                "ProbeConfig.sharpness_iters is 0 while sharpness_every="
                f"{self.sharpness_every}; set sharpness_iters >= 1 or sharpness_every=0"
            )
        if not 0.0 < self.saturation_cos <= 1.0:
            raise ValueError(
                f"ProbeConfig.saturation_cos must lie in (0, 1], got {self.saturation_cos!r}"
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ProbeConfig:
        """Build from a mapping (e.g. a YAML override); an unknown key raises ``ValueError``."""
        reject_unknown_keys(cls, values)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
