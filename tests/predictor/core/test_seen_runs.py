"""The ids a model saw: plain or hashed, read back from new and old model metas."""

from __future__ import annotations

from collapse_guard.predictor.core import seen_runs
from collapse_guard.predictor.core.seen_runs import SeenRuns, hash_run_id, stored_ids


def test_ids_are_hashed_only_past_the_limit(monkeypatch):
    assert stored_ids(["b", "a", "a"]) == ["a", "b"]
    monkeypatch.setattr(seen_runs, "MAX_PLAIN_IDS", 2)
    hashed = stored_ids(["a", "b", "c"])
    assert hashed == sorted(hash_run_id(i) for i in "abc")
    assert all(h.startswith("sha256:") and len(h) == len("sha256:") + 12 for h in hashed)
    seen = SeenRuns.from_meta({"train_run_ids": hashed, "validation_run_ids": ["v"]})
    assert seen.role_of("b") == "train" and seen.role_of("v") == "validation"
    assert seen.role_of("d") is None


def test_old_models_are_read_through_their_split_and_unknown_ones_refuse_nothing():
    old = SeenRuns.from_meta({"split": {"train": ["t"], "validation": ["v"], "test": ["x"]}})
    assert old.partition(["x", "t", "v", "y"]) == (
        ["x", "y"],
        {"train": ["t"], "validation": ["v"]},
    )
    assert not SeenRuns.from_meta({}).known
