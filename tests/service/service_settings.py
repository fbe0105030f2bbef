"""Constants shared by the service fixtures (conftest.py) and the tests that use them."""

from __future__ import annotations

__all__ = ["SERVED_BODY_LIMIT", "SERVED_IDLE_SECONDS", "VARIANT_VERSION"]

SERVED_BODY_LIMIT = 4_000_000  # bytes: small, so that the 413 tests send little
SERVED_IDLE_SECONDS = 2  # a body stalled this long is a 408: short, so the test is quick
VARIANT_VERSION = "variant-40-trees"
