"""Helpers shared by several test folders, importable as ``support`` from any of them.

Test folders are not packages, so each folder's ``conftest.py`` is imported under the one
name ``conftest``: a test importing from ``conftest`` gets whichever folder's came first.
Shared code lives here (``tests/`` is on ``sys.path`` through the root conftest), and each
folder's own constants in a module of a name found nowhere else.
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A loopback TCP port free at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
