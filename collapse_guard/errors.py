"""Errors that mean "the input is wrong", as opposed to "the code is wrong".

The ``collapse-guard`` command prints a :class:`UserInputError` as one line
(:func:`print_error`) and exits with code 2 (``collapse_guard.cli``); any other exception
is a bug and keeps its traceback. A
library error raised for bad input either subclasses :class:`UserInputError` (the run-file
reader's :class:`~collapse_guard.runfiles.RunFileError`) or is listed in
``_MAPPED`` below, for classes defined where this module does not reach.

Imports nothing heavy: the command line imports this at start-up.
"""

from __future__ import annotations

import sys

__all__ = ["UserInputError", "is_user_error", "print_error"]


class UserInputError(ValueError):
    """Bad input from the user: ``message`` names the thing and what is wrong, ``hint``
    says what to do. A ``ValueError``, so that code catching bad values keeps working."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message}; {hint}" if hint else message)


# Library errors that already mean bad input and name the thing and its fix, by module
# and class name: looked up in sys.modules so that the check never imports lightgbm or
# bentoml (an error of a class whose module was never imported cannot have been raised).
_MAPPED = (
    ("collapse_guard.predictor.core.risk", "ModelFormatError"),  # a model folder it cannot use
    (
        "collapse_guard.service.server.model_state",
        "ModelLoadError",
    ),  # a model the service can't serve
)


def is_user_error(error: BaseException) -> bool:
    """Whether ``error`` reports bad input (print it as one line) rather than a bug."""
    if isinstance(error, UserInputError):
        return True
    for module_name, class_name in _MAPPED:
        module = sys.modules.get(module_name)
        if module is not None and isinstance(error, getattr(module, class_name)):
            return True
    return False


def print_error(error: BaseException | str) -> None:
    """``error: <message>`` as one line on stderr, however long (no wrapping): how the
    command line shows bad input, wherever it is caught."""
    from rich.console import Console
    from rich.markup import escape

    # one line: a message that carries line breaks (a library's) is joined, not cut
    text = " ".join(str(error).split())
    Console(stderr=True, soft_wrap=True, highlight=False).print(f"[red]error:[/] {escape(text)}")
