"""The project's documents as tests read them: README.md and docs/*.md, their blocks and sections.

Tests that check a claim read it where it is written: the README keeps the minimal examples,
each docs/*.md the rest of its part. One reader here, so a block that moves between documents
moves its test's one argument, not a copy of a regex.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["DOCUMENTS", "README", "ROOT", "blocks", "curl_body", "section", "text"]

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# the user's documents: the README and every part's page (design, decisions and stack too)
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]


def text(document: Path | str = README) -> str:
    """A document's text; ``document`` a path, or a name under docs/ (``"guard.md"``)."""
    path = document if isinstance(document, Path) else ROOT / "docs" / document
    return path.read_text()


def blocks(language: str, source: str | None = None) -> list[str]:
    """The fenced blocks of ``language`` (```` ```py ```` is not ```` ```python ````), in
    order, of ``source`` (default: the README's text)."""
    found = rf"```{re.escape(language)}\n(.*?)```"
    return re.findall(found, text() if source is None else source, flags=re.DOTALL)


def section(heading: str, source: str | None = None) -> str:
    """The text from the ``## heading...`` line to the next ``## `` (default: the README's)."""
    source = text() if source is None else source
    start = source.index(f"\n## {heading}")
    end = source.find("\n## ", start + 1)
    return source[start : end if end >= 0 else len(source)]


def curl_body(source: str) -> tuple[str, Any]:
    """The first ``curl ... -d '{...}'`` body of ``source``: as written, and parsed."""
    written = re.search(r"-d '(\{.*?\})'", source, flags=re.DOTALL).group(1)
    return written, json.loads(written)
