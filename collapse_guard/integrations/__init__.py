"""The guard inside training frameworks that own the optimizer step.

- :mod:`collapse_guard.integrations.huggingface`: ``GuardCallback``, a transformers
  ``TrainerCallback`` (extra ``hf``);
- :mod:`collapse_guard.integrations.lightning`: ``GuardCallback``, a Lightning
  ``Callback`` (extra ``lightning``);
- :mod:`collapse_guard.integrations.chained`: ``ChainedOptimizer``, several torch
  optimizers as the one a ``Guard`` takes (Muon on the matrices, AdamW on the rest).

Each module imports its framework when it is imported itself, never from here, so
``collapse_guard`` and this package import without either framework installed.
"""

__all__: list[str] = []
