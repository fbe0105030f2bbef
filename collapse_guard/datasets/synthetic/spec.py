"""One synthetic run, described by a small frozen dataclass.

A :class:`RunSpec` holds every random choice the sampler made for one run (outcome,
onset, precursor lead, schedule, noise, confounders); :func:`make_frame` in
``traces.py`` turns it into a run frame with no further choices except the per-step
noise, which comes from ``spec.seed``. A spec is therefore a complete, JSON-able
recipe: stored in the run file's metadata, it regenerates the run bit for bit.

Outcome kinds and the label kind each should get from ``label.label_run``:

======================  ===============  ==============================================
kind                    label kind       what happens
======================  ===============  ==============================================
``healthy``             None             learns; may hold recovered spikes, data spikes,
                                         false precursors, benign logit growth and a
                                         decoys: a collapse kind's precursors, which
                                         peak and resolve (:class:`Decoy`)
``attention_entropy``   ``loss_rise``    attention logits grow exponentially, heads turn
                                         one-hot, loss rises 0.3-0.9 nats and stays
``nonfinite``           ``nonfinite``    loss becomes NaN/inf (LR jump, or a blow-up)
``gradient_collapse``   ``grad_collapse``  grad norm falls 10^3 in one step; loss stuck high
``oscillation``         ``loss_rise``    update directions flip, loss oscillates, drifts
                                         up and stays
======================  ===============  ==============================================
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "COLLAPSE_KINDS",
    "EXPECTED_LABEL_KIND",
    "KINDS",
    "SYNTHETIC_VERSION",
    "Decoy",
    "Gap",
    "RecoveredSpike",
    "RunSpec",
]

COLLAPSE_KINDS: tuple[str, ...] = (
    "attention_entropy",
    "nonfinite",
    "gradient_collapse",
    "oscillation",
)
KINDS: tuple[str, ...] = ("healthy", *COLLAPSE_KINDS)
# Bump when the same (seed, index) makes a different run; stored in every run file's
# extra, so a training set can tell the generators apart. 2: healthy runs carry the
# collapses' precursors as decoys; the param norm grows at the pace of the updates
# (the LR, and larger updates in a blow-up or collapse), and no collapse adds growth of
# its own (issue 8).
SYNTHETIC_VERSION = 2

# What label.label_run should call each outcome; used for the agreement report.
EXPECTED_LABEL_KIND: dict[str, str | None] = {
    "healthy": None,
    "attention_entropy": "loss_rise",
    "nonfinite": "nonfinite",
    "gradient_collapse": "grad_collapse",
    "oscillation": "loss_rise",
}


@dataclass(frozen=True)
class RecoveredSpike:
    """A loss spike that comes back: rises over ``rise`` steps, decays with ``decay``."""

    step: int
    height: float  # nats above the healthy curve at the peak
    rise: int  # steps from start to peak (1 = one-step jump)
    decay: float  # e-folding time of the return, steps


@dataclass(frozen=True)
class Gap:
    """A stretch the probe did not record: rows missing, or one signal group unmeasured."""

    start: int
    length: int
    what: str  # "rows" (no rows at all) or a signal group name ("attention", "update", ...)


@dataclass(frozen=True)
class Decoy:
    """A healthy run's false start: the precursors of collapse kind ``kind`` develop
    over ``lead`` steps into ``peak`` exactly as before that kind's onset, then resolve
    (fade back with e-folding time ``fade`` steps, or level off) and no collapse
    follows."""

    kind: str  # one of COLLAPSE_KINDS
    peak: int
    lead: int
    fade: float
    dsi: bool = False  # the DSI signals go over threshold with it, as in a DSI collapse
    rise: float = 0.0  # nonfinite: nats the loss rises into the peak (a blow-up's)


@dataclass(frozen=True)
class RunSpec:
    """Every choice behind one synthetic run (see the module docstring for ``kind``)."""

    run_id: str
    seed: int  # per-step noise; from SeedSequence.spawn, so independent of worker count
    kind: str  # one of KINDS
    n_steps: int  # rows before gaps/truncation; steps are 0 .. n_steps - 1
    onset: int | None  # generator's intended first collapse step (None when healthy)
    lead: int  # precursor drift starts this many steps before onset (0 = sudden)
    rise: float  # collapse: nats the loss rises and keeps (nonfinite: pre-onset rise)
    rise_steps: int  # collapse: steps over which the rise happens
    dsi: bool  # the seed's three DSI precursors go over threshold before onset
    cause: str  # nonfinite: "lr_jump" | "blowup"; otherwise ""
    # model and data
    vocab: int  # initial loss is about ln(vocab)
    loss_floor: float  # loss the run approaches late in training, nats
    loss_noise: float  # std of per-step loss noise after warmup, nats
    tau_fast: float  # e-folding steps of the warmup drop of the loss
    tau_slow: float  # e-folding steps of the slow improvement afterwards
    dataset: int  # data order: runs on one dataset share their data-spike steps
    # optimizer and schedule
    schedule: str  # "cosine" | "constant" | "step"
    lr_peak: float
    warmup: int  # steps of linear warmup
    lr_min_frac: float  # cosine floor as a fraction of lr_peak
    lr_change_step: int | None  # "step" schedule, or the nonfinite LR jump
    lr_change_factor: float
    amp: bool  # fp16 with a GradScaler: loss_scale / overflow are live
    gpu: bool  # NVML telemetry present (gpu_power_w, gpu_mem_used)
    # confounders
    spikes: tuple[RecoveredSpike, ...] = ()
    false_dsi: tuple[int, int] | None = None  # healthy: (start, length) of a false DSI episode
    benign_logit_growth: float = 0.0  # healthy: decades of attention-logit growth that saturate
    decoys: tuple[Decoy, ...] = ()  # healthy: false starts (collapse precursors that resolve)
    gaps: tuple[Gap, ...] = ()
    truncate_after: int | None = None  # nonfinite: the loop crashed this many steps after onset

    @property
    def collapses(self) -> bool:
        return self.kind != "healthy"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (stored in the run file's ``extra["synthetic_spec"]``)."""
        return asdict(self)
