"""The run-context fields: what the run so far says that a 200-step window cannot.

Each field is computed over every row up to "now" by one compiled accumulator
(:mod:`collapse_guard.features.context_kernel`), the same for a live run and a run file.
Every field is a ratio, a count of steps or a difference of steps: none reads the raw
level of a signal whose level depends on the model (:mod:`collapse_guard.features.readings`).

"Smoothed" is an EWMA over steps (weights decay with the distance in steps, so a signal
measured every 50 steps is averaged as one measured every step): span 10 for "now"
(the loss: time constant 10 steps, the label's ``LabelRule.smooth_steps``), span 1000
for "long". "Early" is the median of a signal's values in the run's first
:data:`EARLY_STEPS` steps; NaN until those steps are over, so that the reference never
moves once it is used.

===================================  =============================================================
field                                why a window cannot know it
===================================  =============================================================
``ctx__steps``                       steps since the run's first row: the first few hundred steps
                                     are loud by nature; a window cannot tell step 150 from 15,000
``ctx__lr_over_peak``                LR now / highest LR so far: where the schedule stands; the
                                     peak can be thousands of steps back
``ctx__lr_over_start``               LR now / first positive LR: how far warm-up has carried it
``ctx__lr_steps_since_rise``         steps since the LR last rose (or since its first value): a
                                     re-warm 150 steps ago sits at the window's edge, 300 ago
                                     is gone
``ctx__lr_over_prior_peak``          LR now / highest LR before the latest re-warm (a rise after
                                     the LR held or fell; NaN if none): > 1 is ground this run has
                                     never been stable on ("rose to twice its peak")
``ctx__loss_over_best``              smoothed loss / best smoothed loss so far: the label's own
                                     quantity (collapse = rising clearly above the best and
                                     staying there); the best can be far back
``ctx__loss_steps_since_best``       steps since the smoothed loss last set a new best: a loss that
                                     stopped improving 500 steps ago looks flat in any window
``ctx__loss_over_early``             smoothed loss / early loss: how much of its initial loss
                                     (~ log vocabulary) the run has shed; vocabulary-free
``ctx__grad_norm_over_long``         smoothed grad norm / its span-1000 EWMA: drift against the
                                     run's long-run level (the window's ewma_ratio spans 10/100)
``ctx__param_norm_over_early``       parameter norm / early: weight growth, slow, precedes logit
                                     growth
``ctx__attn_logit_max_over_early``   largest attention logit / early: the classic instability
                                     grows over hundreds of steps
``ctx__output_logit_max_over_early`` largest output logit / early: output divergence, as slow
===================================  =============================================================
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "CONTEXT_FIELDS",
    "CONTEXT_SIGNALS",
    "EARLY_STEPS",
    "LONG_SPAN",
    "LOSS_SMOOTH_STEPS",
    "SHORT_SPAN",
    "TRACKED",
    "context_names",
]

# The signals the accumulator reads, in the order of its input rows: the LR, then the
# tracked signals (smoothed, long-run and early levels are kept for each).
CONTEXT_SIGNALS: tuple[str, ...] = (
    "lr",
    "loss",
    "grad_norm",
    "param_norm",
    "attn_logit_max",
    "output_logit_max",
)
TRACKED: tuple[str, ...] = CONTEXT_SIGNALS[1:]

# The run's first steps that give its early levels: a default window's worth, but a
# constant of the feature version, not the extractor's window: a model's context
# features must not move with the window a user picks.
EARLY_STEPS = 200
SHORT_SPAN = 10  # steps; "now", as the window's short EWMA
LONG_SPAN = 1000  # steps; five windows: the run's long-run level
LOSS_SMOOTH_STEPS = 10.0  # time constant of the loss's smoothing, as the label's

# (field, the signals it needs), in feature order: the kernel emits them in this order
CONTEXT_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ctx__steps", ()),
    ("ctx__lr_over_peak", ("lr",)),
    ("ctx__lr_over_start", ("lr",)),
    ("ctx__lr_steps_since_rise", ("lr",)),
    ("ctx__lr_over_prior_peak", ("lr",)),
    ("ctx__loss_over_best", ("loss",)),
    ("ctx__loss_steps_since_best", ("loss",)),
    ("ctx__loss_over_early", ("loss",)),
    ("ctx__grad_norm_over_long", ("grad_norm",)),
    ("ctx__param_norm_over_early", ("param_norm",)),
    ("ctx__attn_logit_max_over_early", ("attn_logit_max",)),
    ("ctx__output_logit_max_over_early", ("output_logit_max",)),
)


def context_names(signals: Sequence[str]) -> tuple[str, ...]:
    """The context fields computed for a schema of ``signals`` (those whose signals it
    has), in feature order."""
    return tuple(name for name, needs in CONTEXT_FIELDS if all(s in signals for s in needs))
