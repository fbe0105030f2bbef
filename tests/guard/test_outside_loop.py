"""benchmarks/outside_loop.py: a GPT and a loop written apart from the project, guarded
through the public API alone. Its schedules, and a quiet guard in that loop training the
plain loop's run to the last bit."""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).parents[2] / "benchmarks" / "outside_loop.py"
    spec = importlib.util.spec_from_file_location("outside_loop", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["outside_loop"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules["outside_loop"]


def test_the_schedules_warm_up_rise_and_decay_as_named(bench):
    cosine = bench.SETUPS["adamw_hot"]  # peak 3e-2, warmup 100, cosine to 0.1x over 600
    assert bench.lr_at(cosine, 99, 3e-2) == pytest.approx(3e-2)
    assert bench.lr_at(cosine, 599, 3e-2) == pytest.approx(3e-3, rel=1e-3)
    ramp = bench.SETUPS["adamw_ramp1000"]  # 1e-3 -> 1.0 geometric over steps 250-450
    assert bench.lr_at(ramp, 249, 1.0) == pytest.approx(1e-3)
    assert bench.lr_at(ramp, 350, 1.0) == pytest.approx(math.sqrt(1e-3 * 1.0))
    assert bench.lr_at(ramp, 500, 1.0) == 1.0
    assert bench.lr_at(ramp, 500, 1e-3) == 1e-3  # the safe arm: no rise at all
    rewarm = bench.SETUPS["adamw_rewarm_hi"]  # 3e-3 -> 0.3 linear over steps 300-400
    assert bench.lr_at(rewarm, 350, 0.3) == pytest.approx((3e-3 + 0.3) / 2)
    jump = bench.SETUPS["adamw_jump"]  # 3e-3, a step change to 0.1 at step 300
    assert [bench.lr_at(jump, s, 0.1) for s in (299, 300, 599)] == [3e-3, 0.1, 0.1]
    assert bench.lr_at(jump, 300, 3e-3) == 3e-3  # the safe arm stays at the base


def test_each_round_is_apart_from_the_ones_before(bench):
    """Six rounds of 18 set-ups, each made after the one before had been read: each later
    set-up its own seed (its language and initial weights), none an earlier one again."""
    rounds = {r: [s for s in bench.SETUPS.values() if s.round == r] for r in range(1, 7)}
    assert [len(setups) for setups in rounds.values()] == [18] * 6
    seeds = [s.seed for r in range(2, 7) for s in rounds[r]]
    assert len(set(seeds)) == 90 and 0 not in seeds
    shapes = [{replace(s, name="", seed=0, round=0) for s in rounds[r]} for r in rounds]
    assert sum(map(len, shapes)) == len(set().union(*shapes)) == 108  # no shape twice


def test_a_quiet_guard_in_the_users_loop_trains_the_plain_run(bench):
    """40 steps of a healthy set-up: no rule fires, so the guarded losses are the unguarded
    ones bit for bit; the safe arm's lower LR trains another run."""
    setup = replace(bench.SETUPS["adamw_hot"], steps=40)
    plain, guarded = bench.train(setup, "unguarded"), bench.train(setup, "guarded")
    assert guarded["summary"]["rescues"] == 0 and guarded["summary"]["skipped"] == 0
    assert guarded["losses"] == plain["losses"] and len(plain["losses"]) == 40
    assert bench.train(setup, "safe")["losses"][5:] != plain["losses"][5:]
    assert plain["losses"][-1] < plain["losses"][0] - 0.2  # it learns


def test_a_quiet_guard_leaves_torch_s_scheduler_and_accumulation_alone(bench):
    """The third round's loop: torch's LambdaLR stepped after ``guard.step``, two
    micro-batches a step. Quiet, the guard trains the plain run bit for bit: it reads the LR
    the scheduler set and gives it back."""
    setup = replace(bench.SETUPS["adamw_accum_ok"], steps=30, scheduler="lambda")
    plain, guarded = bench.train(setup, "unguarded"), bench.train(setup, "guarded")
    assert guarded["summary"]["rescues"] == 0 and guarded["summary"]["skipped"] == 0
    assert guarded["losses"] == plain["losses"] and len(plain["losses"]) == 30


@pytest.mark.parametrize("name", ["adamw_fp16_ok", "adamw_all_ok", "adamw_scaled_ok"])
def test_a_quiet_guard_leaves_the_loops_habits_alone(bench, name):
    """The fifth and sixth rounds' loops: fp16 autocast with a GradScaler handed to the
    guard; bf16 autocast, nanoGPT's two groups, dropout, activation checkpointing and an
    evaluation forward every 25 steps; a group at 0.1x the LR. Quiet, the guard trains the
    plain run bit for bit: the scaler's unscale, step and update, the evaluation's forward
    and each group's own LR are the loop's."""
    setup = replace(bench.SETUPS[name], steps=30)
    plain, guarded = bench.train(setup, "unguarded"), bench.train(setup, "guarded")
    assert guarded["summary"]["rescues"] == 0 and guarded["summary"]["skipped"] == 0
    assert guarded["losses"] == plain["losses"] and len(plain["losses"]) == 30
    assert plain["losses"][-1] < plain["losses"][0] - 0.1  # it learns
