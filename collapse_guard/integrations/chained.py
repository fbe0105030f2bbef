"""``ChainedOptimizer``: several torch optimizers as the one a ``Guard`` takes.

Its home is the shared leaf ``collapse_guard._chained``, below the dataset generators that
build Muon with AdamW from it; this is its public path.
"""

from __future__ import annotations

from collapse_guard._chained import ChainedOptimizer

__all__ = ["ChainedOptimizer"]
