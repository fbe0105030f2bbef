"""How often the label (the ground truth) agrees with what the generator meant.

The label decides every training target; the generator only intends. A large
disagreement means one of them is off: a collapse too small for the label's margin,
a healthy run that wanders too far, an onset the label places elsewhere. Run
:func:`label_agreement` on any set of synthetic metadata to see where.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from collapse_guard.datasets.synthetic.spec import EXPECTED_LABEL_KIND
from collapse_guard.runfiles import RunMeta

__all__ = ["AgreementReport", "label_agreement", "onset_agrees"]

# The label's onset is where its smoothed loss crosses best + margin: inside the
# generator's rise, up to rise_steps later (plus the EWMA's lag), or earlier by up
# to the precursor lead when a pre-onset drift already crosses it.
_ONSET_SLACK = 100


def onset_agrees(meta: RunMeta) -> bool:
    """The label's onset lies where the generator's collapse happens."""
    onset, extra = meta.onset_step, meta.extra
    intended = extra.get("synthetic_onset")
    if onset is None or intended is None:
        return onset is None and intended is None
    lead, rise = extra.get("synthetic_lead", 0), extra.get("synthetic_rise_steps", 0)
    return intended - max(lead, 50) <= onset <= intended + rise + _ONSET_SLACK


@dataclass
class AgreementReport:
    """Counts over runs; rates are shares of ``n``."""

    n: int = 0
    outcome_agree: int = 0  # collapsed-or-not agrees
    kind_agree: int = 0  # label kind is the one expected for the generator's kind
    onset_agree: int = 0  # outcome agrees and (for collapses) onset within the slack
    # (generator kind, label kind or "healthy") -> runs
    confusion: Counter = field(default_factory=Counter)

    def rate(self, count: int) -> float:
        return count / self.n if self.n else float("nan")

    def summary(self) -> str:
        outcome, kind = self.rate(self.outcome_agree), self.rate(self.kind_agree)
        onset = self.rate(self.onset_agree)
        lines = [
            f"label agreement over {self.n} runs: outcome {outcome:.1%}, kind {kind:.1%}, "
            f"outcome+onset {onset:.1%}"
        ]
        for (gen, lab), count in sorted(self.confusion.items()):
            lines.append(f"  generator {gen:<18} label {lab:<14} {count}")
        return "\n".join(lines)


def label_agreement(metas: Iterable[RunMeta]) -> AgreementReport:
    report = AgreementReport()
    for meta in metas:
        gen_kind = meta.extra.get("synthetic_kind")
        if gen_kind is None:
            raise ValueError(
                f"run {meta.run_id!r} has no extra['synthetic_kind']: not written by the "
                "synthetic generator; pass only synthetic run metadata"
            )
        label_kind = meta.extra.get("collapse_kind")
        report.n += 1
        report.confusion[(gen_kind, label_kind or "healthy")] += 1
        same_outcome = (gen_kind == "healthy") == (meta.onset_step is None)
        report.outcome_agree += same_outcome
        report.kind_agree += EXPECTED_LABEL_KIND[gen_kind] == label_kind
        report.onset_agree += same_outcome and onset_agrees(meta)
    return report
