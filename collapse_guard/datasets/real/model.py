"""The ``gpt`` family under its first name: ``GPT`` and ``GPTConfig`` (see ``models/gpt.py``)."""

from collapse_guard.datasets.real.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
