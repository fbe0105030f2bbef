"""The guard: acts on the collapse risk inside a PyTorch training loop (docs/design.md, "Guard").

``Guard(model, optimizer, checkpoint_dir=...)``, then ``decision = guard.step(loss)`` in
place of ``optimizer.step()``; ``guard.close()`` at the end. Where each action happens:
:mod:`collapse_guard.guard.guard`; the rules: :mod:`collapse_guard.guard.decision`; every
number: :class:`GuardPolicy`.
"""

from collapse_guard.guard.decision import GuardDecision, StepFacts, decide
from collapse_guard.guard.guard import Guard, GuardGaveUp
from collapse_guard.guard.policy import RISK_LEVELS, GuardPolicy
from collapse_guard.guard.qk_clip import QKLayout
from collapse_guard.guard.risk_spec import ServiceRisk
from collapse_guard.guard.schedule import warmup_cosine
from collapse_guard.guard.trackers import Trackers, guard_metrics

__all__ = [
    "RISK_LEVELS",
    "Guard",
    "GuardDecision",
    "GuardGaveUp",
    "GuardPolicy",
    "QKLayout",
    "ServiceRisk",
    "StepFacts",
    "Trackers",
    "decide",
    "guard_metrics",
    "warmup_cosine",
]
