"""The risk service itself: the BentoML service and everything its routes call.

``risk_service`` (:class:`~collapse_guard.service.server.risk_service.RiskService`, the
BentoML entry: ``bentoml serve collapse_guard.service.server.risk_service:RiskService``)
and ``serve_command`` (``collapse-guard serve``); reading bodies: ``json_reader``,
``arrow_reader``, into ``windows`` held to ``window_checks``, with ``collapse_now`` (a
measured non-finite loss); answering: ``scoring`` and ``treeshap`` (contributions);
the model: ``model_state`` (load, check, swap; the model files through
``predictor.core.model_file``, proved complete before they are parsed) and
``reload_channel`` (a reload reaches every worker, through a private file only the serve's
own processes know); ``lifeline`` (a worker ends with its server); ``openapi`` (the bodies
the routes read themselves). Imports the client side (the wire format) and the
middleware, never the reverse. Nothing is imported here: ``--help`` stays light.
"""

__all__: list[str] = []
