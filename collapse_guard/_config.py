"""One check shared by every config that is built from a mapping: an unknown key is an error.

Kept at the top level, with nothing but the standard library, so that ``probe`` and
``datasets`` can both use it without importing each other (docs/design.md, "Layout").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields

__all__ = ["reject_unknown_keys"]


def reject_unknown_keys(
    cls: type, keys: Iterable[str], *, where: str = "", error: type[Exception] = ValueError
) -> None:
    """Raise ``error`` when a key of ``keys`` is not a field of the dataclass ``cls``.

    The message names the unknown keys and every known one (a typo is then easy to
    spot), after ``where`` (e.g. a file path) when given::

        unknown ProbeConfig key(s) ['attn_every']; known keys are ['attention_every', ...]
    """
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(keys) - known)
    if unknown:
        prefix = f"{where}: " if where else ""
        raise error(
            f"{prefix}unknown {cls.__name__} key(s) {unknown}; known keys are {sorted(known)}"
        )
