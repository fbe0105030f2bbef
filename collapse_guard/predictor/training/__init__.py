"""Fitting: run files to rows, run-level splits, the model fitted, calibrated and levelled,
cross-fitted levels, leave-one-group-out. Imports ``core`` and ``evaluate``, never above."""

__all__: list[str] = []
