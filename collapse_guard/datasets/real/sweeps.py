"""Which sweep draws run ``i``: the sampler's (``sampler.py``) or the breadth sweep's.

Kept apart from both so that neither imports the other: ``breadth.py`` builds on the
sampler's draws, and the sampler knows nothing of it.
"""

from __future__ import annotations

from collapse_guard.datasets.real.breadth import sample_breadth_config
from collapse_guard.datasets.real.config import RealRunConfig
from collapse_guard.datasets.real.sampler import Focus
from collapse_guard.datasets.real.sampler import sample_config as sample_sampler_config

__all__ = ["sample_config", "sample_configs"]


def sample_config(
    seed: int, index: int, steps: int = RealRunConfig.steps, focus: Focus | None = None
) -> RealRunConfig:
    """Config of run ``index`` of the sweep drawn with ``seed`` and ``focus`` (a function
    of these only): the breadth sweep's when ``focus.breadth``, else the sampler's."""
    if focus is not None and focus.breadth:
        return sample_breadth_config(seed, index, steps, focus)
    return sample_sampler_config(seed, index, steps, focus)


def sample_configs(
    n: int, seed: int = 0, steps: int = RealRunConfig.steps, focus: Focus | None = None
) -> list[RealRunConfig]:
    """The first ``n`` configs of the sweep drawn with ``seed`` (and ``focus``)."""
    return [sample_config(seed, i, steps, focus) for i in range(n)]
