"""One way to reach a Dask scheduler named on the command line, failing fast and plainly.

``data real --scheduler`` and ``train --dask`` / ``retrain --dask`` take a scheduler
address. distributed's own default waits 30 s for one that is not there, then raises an
``OSError`` whose traceback is ~190 lines: here the wait is :data:`CONNECT_TIMEOUT_S`
and the failure a :class:`~collapse_guard.errors.UserInputError` (one ``error:`` line,
exit code 2) that names the option, the address and what to do.

distributed is imported when a client is made: importing this module is free.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from collapse_guard.errors import UserInputError

__all__ = ["CONNECT_TIMEOUT_S", "scheduler_client"]

# A scheduler on the network answers in milliseconds; 5 s leaves room for a loaded one
# without making a typo wait half a minute.
CONNECT_TIMEOUT_S = 5


@contextmanager
def scheduler_client(address: str, option: str) -> Iterator:
    """A ``distributed.Client`` of the scheduler at ``address`` (``tcp://host:8786``),
    closed on exit; ``option`` is the command-line option that named it, for the error."""
    from distributed import Client

    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, ValueError, TypeError) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise UserInputError(
            f"{option} {address}: no Dask scheduler answered within {CONNECT_TIMEOUT_S} s "
            f"({reason})",
            "start one (`dask scheduler`, workers with `dask worker ADDRESS`) and pass its "
            f"address, e.g. tcp://127.0.0.1:8786, or leave out {option} to run on this machine",
        ) from None
    with client:
        yield client
