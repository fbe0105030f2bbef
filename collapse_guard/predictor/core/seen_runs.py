"""Which runs a model has seen: stored in its meta at training, checked before evaluation.

A model is graded only on runs it never trained or validated on (docs/design.md, "Predictor").
``train_risk_model`` stores the ids of its training and validation runs in the model's
meta, under ``train_run_ids`` and ``validation_run_ids``; ``evaluate`` and the benchmark
read them back with :meth:`SeenRuns.from_meta` and refuse (or set apart) those runs.

Past :data:`MAX_PLAIN_IDS` ids a list is stored as short hashes (``sha256:`` and the
first 12 hex digits of the id's SHA-256): the bundled model ships in every install and
must stay under 5 MB; 12 hex digits (48 bits) make a false match between 10^4 stored ids
and 10^4 evaluated ones about 10^-7 likely. Models trained before these keys existed are
read through their ``split`` record (the ids of every split).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_PLAIN_IDS", "ROLES", "SeenRuns", "hash_run_id", "merged_ids", "stored_ids"]

MAX_PLAIN_IDS = 5_000  # ids kept readable; ~30 bytes each, so <= ~150 KB per list
_HASH_PREFIX = "sha256:"
ROLES = ("train", "validation")  # what a model saw: fitted on, or calibrated / levelled on


def hash_run_id(run_id: str) -> str:
    """The stored form of one run id in a hashed list."""
    return _HASH_PREFIX + hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:12]


def stored_ids(ids: Iterable[str]) -> list[str]:
    """Sorted ids as stored in a model's meta: plain, or hashed past MAX_PLAIN_IDS."""
    ids = sorted(set(ids))
    return ids if len(ids) <= MAX_PLAIN_IDS else sorted(hash_run_id(i) for i in ids)


def merged_ids(stored: Iterable[str], ids: Iterable[str]) -> list[str]:
    """A stored list (plain or hashed) with more plain ids added, as :func:`stored_ids` keeps
    it: once one stored id is a hash, every id is (a hash cannot be turned back)."""
    stored = list(stored)
    if any(i.startswith(_HASH_PREFIX) for i in stored):
        return sorted({*stored, *map(hash_run_id, ids)})
    return stored_ids([*stored, *ids])


@dataclass(frozen=True)
class SeenRuns:
    """The run ids (or their hashes) a model trained and validated on."""

    train: frozenset[str]
    validation: frozenset[str]

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> SeenRuns:
        """Read ``train_run_ids`` / ``validation_run_ids``, else the ``split`` record."""
        split = meta.get("split") or {}
        return cls(
            train=frozenset(meta.get("train_run_ids", split.get("train", ()))),
            validation=frozenset(meta.get("validation_run_ids", split.get("validation", ()))),
        )

    @property
    def known(self) -> bool:
        """False for a model that stores no ids (then nothing can be refused)."""
        return bool(self.train or self.validation)

    def role_of(self, run_id: str) -> str | None:
        """``"train"``, ``"validation"`` or None (never seen)."""
        for role in ROLES:
            ids = getattr(self, role)
            if run_id in ids or hash_run_id(run_id) in ids:
                return role
        return None

    def partition(self, run_ids: Iterable[str]) -> tuple[list[str], dict[str, list[str]]]:
        """(unseen ids, {role: seen ids of that role}) in the given order."""
        unseen: list[str] = []
        seen: dict[str, list[str]] = {role: [] for role in ROLES}
        for run_id in run_ids:
            role = self.role_of(run_id)
            (unseen if role is None else seen[role]).append(run_id)
        return unseen, seen
