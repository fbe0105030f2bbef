"""The risk service's HTTP middleware and the worker settings around its routes.

``auth`` (the bearer token), ``body_limit`` (413 over the size limit, 408 for a stalled
body), ``limits`` (what one request may hold, with the evidence), ``bad_request`` (every
4xx: field, what was expected, the fix), ``metrics`` (Prometheus, and BentoML's request
labels folded) and ``memory`` (the allocator keeps freed memory). Imports the client side
(the wire format) and nothing of the server: the server adds these to its routes.
"""

__all__: list[str] = []
