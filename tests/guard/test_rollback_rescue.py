"""The cheaper rescues of issue 24: what a rollback restores, QK-clip from the first
rescue on, and how the rescue benchmark decides that a run was saved."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.datasets.real.config import RealRunConfig
from collapse_guard.guard import Guard
from collapse_guard.guard.checkpoints import CheckpointRing

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import guard_rescue  # benchmarks/ is not a package: the scripts import it by path too


def _ring(tmp_path, losses: dict[int, float]) -> CheckpointRing:
    ring = CheckpointRing(tmp_path, keep=len(losses))
    for step, loss in losses.items():
        ring.save(step, {"model": {"w": torch.full((2,), float(step))}, "loss": loss})
    return ring


def test_average_span_zero_rolls_back_to_the_newest_alone(tmp_path):
    # three checkpoints of one basin (losses within 5%, 100 steps apart): the default
    # span averages all three; span 0, the benchmark's ``newest`` arm, keeps the newest
    ring = _ring(tmp_path, {100: 2.00, 200: 1.98, 300: 1.97})
    assert [p.name[-9:] for p in ring.basin(300, 0.05)] == ["000100.pt", "000200.pt", "000300.pt"]
    assert ring.rollback_state(ring.basin(300, 0.05))["model"]["w"].tolist() == [200.0, 200.0]
    newest = ring.basin(0, 0.05)
    assert [p.name[-9:] for p in newest] == ["000300.pt"]
    assert ring.rollback_state(newest)["model"]["w"].tolist() == [300.0, 300.0]


def test_rescue_mode_clips_only_from_the_first_rescue_on(tmp_path):
    model, optimizer = tiny_model(seed=0, lr=1e-2)
    loop = Loop(seed=0)
    # tau 0.01: the tiny GPT's heads are over it from the first step ("always" clips
    # after steps 1 and 11: test_qk_clip.py), so every probe pass after the rescue plans
    config = {"qk_clip": "rescue", "qk_clip_tau": 0.01, "max_skip_streak": 1}
    guard = Guard(model, optimizer, tmp_path, risk="off", policy=config, preflight=False)
    for step in range(33):
        loss = loop.loss(model)
        decision = guard.step(torch.tensor(math.nan) if step == 12 else loss)
        optimizer.zero_grad()
        assert decision.rescue == (step == 12)
    guard.close()
    clipped = sorted({s for s, e in guard.events if e.startswith("qk_clip:")})
    assert clipped == [21, 31]  # the passes of steps 20 and 30, applied a step later
    assert guard.qk_clips == sum(e.startswith("qk_clip:") for _, e in guard.events) > 0


def test_token_entropy_of_known_streams():
    assert guard_rescue.token_entropy(list(range(8)) * 50, 8) == pytest.approx(0.0, abs=1e-12)
    g = torch.Generator().manual_seed(0)
    uniform = torch.randint(0, 4, (200_000,), generator=g).numpy()
    assert guard_rescue.token_entropy(uniform, 4) == pytest.approx(math.log(4), abs=2e-3)


@pytest.mark.parametrize(
    ("level", "saved"),
    [(3.0, True), (3.5, False)],  # the language of 64 ids: bigram entropy 3.130 nats
)
def test_a_healthy_run_that_never_learns_past_bigrams_is_not_saved(level, saved):
    config = RealRunConfig(data="language", vocab_size=64)
    losses = [4.2 - (4.2 - level) * s / 100 for s in range(100)] + [level] * 400
    task = {"index": 0, "half": None, "mechanism": "x", "recipe": "x", "arm": "a", "key": "-"}
    row = guard_rescue.result_row(task, config, {"losses": losses}, 1.0)
    assert row["bigram"] == pytest.approx(3.1302, abs=1e-4)
    assert row["healthy"] and row["best_loss"] == pytest.approx(level)
    assert row["saved"] is saved


def test_an_arm_is_read_from_the_guarded_run_only_when_it_would_train_the_same_run():
    quiet = {"logit_max": 99.5, "rescues": 0, "averaged": 1}
    loud = {"logit_max": 100.5, "rescues": 1, "averaged": 3}
    never_probed = {"logit_max": None, "rescues": 0, "averaged": 0}
    same = guard_rescue.same_as_guarded
    assert same("guarded_no_qk", quiet) and same("guarded_qk_watch", quiet)
    assert same("rescue_qk", quiet) and same("rescue_both", quiet) and same("newest", quiet)
    assert same("rescue_quarter", quiet) and same("rescue_quarter", loud) is None
    assert same("rescue_developed", loud) == "the policy's defaults"  # the default cap
    for arm in ("guarded_no_qk", "guarded_qk_watch", "rescue_qk", "rescue_both", "newest"):
        assert same(arm, loud) is None
    # the guarded arm clips from the first step: a run rescued without a head over tau
    # is the rescue arms' run only if it was never rescued either
    rescued_quiet = {"logit_max": 99.5, "rescues": 1, "averaged": 1}
    assert same("rescue_qk", rescued_quiet) is None and same("guarded_no_qk", rescued_quiet)
    clipped = {"logit_max": 100.5, "rescues": 0, "averaged": 1}
    assert same("rescue_both", clipped) is None and same("newest", clipped)
    assert same("guarded_no_qk", never_probed) is None  # no reading: trained
    assert same("qk_alone", quiet) is None and same("safe_lr", quiet) is None
    # a cap that lifts differs only after a rescue; the forecast's arms only from a warn on
    assert same("lifting", quiet) == "no rescue" and same("lifting_slow", loud) is None
    assert same("skip_z6", {**quiet, "skips": 0}) is None  # a tighter bound: it may skip
    for arm in guard_rescue.FORECAST_ARMS:
        assert same(arm, {**loud, "first_warning": None}) == "never at warn"
        assert same(arm, {**quiet, "first_warning": 420}) is None


def test_the_guard_key_reads_the_code_not_its_docstrings_or_comments(tmp_path):
    paths = [tmp_path / f"{name}.py" for name in "abc"]
    paths[0].write_text('"""A."""\n\ndef f(x):\n    """Old."""\n    return x + 1  # why\n')
    paths[1].write_text('"""B, reworded."""\n\ndef f(x):\n    """New."""\n    return x + 1\n')
    paths[2].write_text('"""A."""\n\ndef f(x):\n    """Old."""\n    return x + 2  # why\n')
    code = [guard_rescue._code(p) for p in paths]
    assert code[0] == code[1] and code[0] != code[2]
