"""A retrain's new runs, the user's set-up, dealt into what each is for.

The new runs of a retrain are runs of the set-up the fleet trains now; the dataset under
``--base`` holds other set-ups (synthetic, real, other users'). A challenger that is to
serve this set-up is judged where it will serve: its levels set on some of the new healthy
runs and its levels and recall measured on others, which neither model trained on
(``promotion``). So before training, the new runs are dealt, seeded:

===============  ===============================================================================
role             which new runs
===============  ===============================================================================
``held_out``     half the healthy runs (rounded down) and half the collapsing ones (rounded
                 up: recall needs a collapse to catch): never trained or calibrated on; the
                 comparison's levels and recall are measured on them
``calibration``  the other healthy runs: the challenger's levels are set on them (never
                 trained on: ``recalibrate.calibrate`` refuses runs a model trained on)
training         the other collapsing runs (and, without recalibration, the other healthy
                 runs), beside the dataset's
===============  ===============================================================================

The deal depends only on the set of runs and the seed (ids sorted, then shuffled), so a
rerun after a crash deals the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collapse_guard.runfiles import RunMeta

__all__ = ["SetupRuns", "split_setup_runs"]


@dataclass(frozen=True)
class SetupRuns:
    """The new runs set apart from training, by role (module docstring)."""

    held_out: tuple[str, ...] = ()
    calibration: tuple[str, ...] = ()

    @property
    def apart(self) -> frozenset[str]:
        """Every new run the challenger does not train on."""
        return frozenset(self.held_out) | frozenset(self.calibration)


def _shuffled(ids: Sequence[str], rng: np.random.Generator) -> list[str]:
    ordered = sorted(ids)
    return [ordered[i] for i in rng.permutation(len(ordered))]


def split_setup_runs(
    metas: Sequence[RunMeta], *, seed: int = 0, calibrate: bool = True
) -> SetupRuns:
    """Deal the new runs ``metas`` into held-out and calibration runs (module docstring)."""
    rng = np.random.default_rng(seed)
    healthy = _shuffled([m.run_id for m in metas if m.onset_step is None], rng)
    collapsed = _shuffled([m.run_id for m in metas if m.onset_step is not None], rng)
    held_healthy = len(healthy) // 2
    held = healthy[:held_healthy] + collapsed[: (len(collapsed) + 1) // 2]
    calibration = healthy[held_healthy:] if calibrate else []
    return SetupRuns(tuple(sorted(held)), tuple(sorted(calibration)))
