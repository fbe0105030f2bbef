"""Byte-level training text: the Python standard library's own sources.

Every Python installation ships the same text next to ``os.py``, so the corpus needs
no download and is identical wherever the same Python version runs. Files are read
in sorted order and the corpus is capped, so that two processes (two pool workers,
two machines of a Dask cluster) train on exactly the same bytes.
"""

from __future__ import annotations

import os
import sysconfig
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["DEFAULT_MAX_BYTES", "load_corpus", "stdlib_dir"]

DEFAULT_MAX_BYTES = 4_000_000  # ~4 MB: far more text than a 1,500-step run of 16x64 tokens sees


def stdlib_dir() -> Path:
    """The folder that holds the standard library's ``.py`` files (where ``os.py`` lives)."""
    candidate = Path(sysconfig.get_paths()["stdlib"])
    if (candidate / "os.py").is_file():
        return candidate
    return Path(os.__file__).resolve().parent


@lru_cache(maxsize=4)
def load_corpus(max_bytes: int = DEFAULT_MAX_BYTES) -> np.ndarray:
    """The corpus as a read-only ``uint8`` array of at most ``max_bytes`` bytes.

    Only the top-level modules are used (not ``test/`` or ``site-packages/``): they are
    present in every installation, and installed packages differ between machines.
    """
    folder = stdlib_dir()
    files = sorted(folder.glob("*.py"))
    if not files:
        raise FileNotFoundError(
            f"expected Python standard-library sources (*.py) in {folder}, got none; "
            "this Python was installed without its sources: install a full Python build"
        )
    chunks: list[bytes] = []
    total = 0
    for path in files:
        data = path.read_bytes()
        chunks.append(data[: max_bytes - total])
        total += len(chunks[-1])
        if total >= max_bytes:
            break
    corpus = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    corpus.flags.writeable = False  # shared by every run of a worker through the cache
    return corpus
