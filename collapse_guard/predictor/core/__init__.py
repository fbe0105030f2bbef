"""The model as users, the service and the guard load it; nothing here trains or reports.

``risk`` (:class:`RiskModel`: a folder or a registry URI in, risk and level by step out),
``model`` (the LightGBM classifier), ``calibration``, ``levels`` (false-alarm budgets and
the alarm levels they set), ``hold`` (the risk hold), ``recalibrate`` (levels on a user's
own healthy runs: ``RiskModel.calibrate``), ``seen_runs``, ``store``, ``model_source``
(where a model is loaded from) and ``model_file`` (the one loader of a model folder: files
proved complete and parsed in a child first, levels and hold checked), ``version`` (the
name a model serves under). Imports only
``features``, ``runfiles`` and the shared leaves.
"""

__all__: list[str] = []
