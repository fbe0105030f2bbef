"""collapse-guard: forecast and prevent training collapse in transformer training runs.

The parts are subpackages (``probe``, ``datasets``, ``features``, ``predictor``,
``service``, ``guard``); import what you need from them. The top level stays light so
that ``import collapse_guard`` never pulls torch.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
