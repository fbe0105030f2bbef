"""The commands (``collapse-guard train | evaluate | predict | calibrate | retrain`` and the
bundle), mounted by ``collapse_guard.cli``: the only layer that prints tables."""

__all__: list[str] = []
