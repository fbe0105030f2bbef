"""Constants shared by the service fixtures (conftest.py) and the tests that use them."""

from __future__ import annotations

__all__ = ["SERVED_BODY_LIMIT", "VARIANT_VERSION"]

SERVED_BODY_LIMIT = 4_000_000  # bytes: small, so that the 413 tests send little
VARIANT_VERSION = "variant-40-trees"
