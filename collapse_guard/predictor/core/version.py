"""The version a model is named by wherever it serves: the service's ``/model`` and
answers, and the guard's ``summary()`` (one rule, so the two can be compared)."""

from __future__ import annotations

from typing import Any

__all__ = ["content_version"]


def content_version(model: Any, numbered: bool) -> str:
    """``model``'s label, with its content digest unless the label ends with it or the
    registry ``numbered`` it (a registry version's number names one upload)."""
    label = str(model.meta["version"])
    digest = model.fingerprint()[:8]
    return label if numbered or label.endswith(digest) else f"{label}+{digest}"
