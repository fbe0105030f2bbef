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
``ctx__loss_per_log_lr_rise``        opt-in (below): log(smoothed loss now / at the reference) /
                                     log(top LR of the rise / LR at the reference): how the loss
                                     answers the LR's climb. <= 0: the run absorbs the rise (the
                                     loss keeps falling or holds); > 0: it turns up per e-fold
                                     of LR
``ctx__grad_norm_per_log_lr_rise``   opt-in: the same for the smoothed grad norm
===================================  =============================================================

**The rise response** (the last two fields). A rise begins at a row whose LR rose after
the LR had held or fallen for :data:`LR_SETTLE_ROWS` rows (or at the run's first rise,
the warm-up); its reference is the row before it (the LR before the climb, the loss that
had not felt it yet). While the LR keeps rising, the reference moves up the rise so that
it stays between :data:`RESPONSE_STEPS` and twice that many steps back: the response of
the latest stretch of the climb, not of the whole rise (a warm-up's early fall of the loss
would hide a late turn up). Once the rise is over the reference holds, so the field goes
on reading the loss against the climb for :data:`~collapse_guard.features.rises.RISE_STEPS`
steps after the LR last rose (the evaluation's "inside an LR rise"), NaN after them and
NaN until the LR has climbed a share :data:`MIN_LOG_LR_CLIMB` (in log) above the
reference. Ratios of logs: free of the loss's scale (log vocabulary) and of the model's
grad-norm level.

The two are **opt-in** (:data:`OPT_IN_CONTEXT`): a schema has them only when asked for
(``extra_context``), so every model trained before them keeps its schema, fingerprint and
risk to the bit; ``benchmarks/predictor_eval.py --extra-context`` trains with them.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "CONTEXT_FIELDS",
    "CONTEXT_SIGNALS",
    "EARLY_STEPS",
    "LONG_SPAN",
    "LOSS_SMOOTH_STEPS",
    "LR_SETTLE_ROWS",
    "MIN_LOG_LR_CLIMB",
    "OPT_IN_CONTEXT",
    "RESPONSE_STEPS",
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
# A rise counts as a re-warm (against the peak before it), and a rise response starts
# afresh, once the LR has held or fallen for this many rows in a row: a warm-up that
# repeats a value once is still warm-up.
LR_SETTLE_ROWS = 10.0
# The rise response's reference sits 50-100 steps back in the rise: the smoothed loss
# (time constant 10 steps) has answered by then, and a quarter of a horizon is "recent".
RESPONSE_STEPS = 50.0
# log(1.02): a climb of 2 % at least, so that the smoothed loss's noise (about 0.5 % at
# time constant 10) moves the ratio by well under 1
MIN_LOG_LR_CLIMB = 0.0198

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
    ("ctx__loss_per_log_lr_rise", ("lr", "loss")),
    ("ctx__grad_norm_per_log_lr_rise", ("lr", "grad_norm")),
)
# Fields a schema has only when asked for (module docstring); the others are the default.
OPT_IN_CONTEXT: tuple[str, ...] = ("ctx__loss_per_log_lr_rise", "ctx__grad_norm_per_log_lr_rise")


def context_names(signals: Sequence[str], extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The context fields computed for a schema of ``signals`` (those whose signals it
    has), in feature order: the default ones and the opt-in fields named in ``extra``."""
    unknown = sorted(set(extra) - set(OPT_IN_CONTEXT))
    if unknown:
        raise ValueError(
            f"extra context fields must be opt-in fields {list(OPT_IN_CONTEXT)}; got "
            f"{unknown}; the other context fields are always there"
        )
    wanted = set(extra)
    return tuple(
        name
        for name, needs in CONTEXT_FIELDS
        if (name not in OPT_IN_CONTEXT or name in wanted) and all(s in signals for s in needs)
    )
