"""features.rises: the one definition of "in an LR rise", on hand-made LR schedules."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collapse_guard.features.rises import (
    LR_RISE_TOL,
    RISE_STEPS,
    frame_in_lr_rise,
    in_lr_rise,
    lr_rise_steps,
    rows_in_lr_rise,
)
from collapse_guard.runfiles.label import HORIZON

STEPS = np.arange(1000)


def covered(mask: np.ndarray) -> list[tuple[int, int]]:
    """The stretches [first, last] of steps in a rise."""
    steps = STEPS[mask]
    if not steps.size:
        return []
    breaks = np.flatnonzero(np.diff(steps) > 1)
    firsts = [steps[0], *steps[breaks + 1]]
    lasts = [*steps[breaks], steps[-1]]
    return [(int(a), int(b)) for a, b in zip(firsts, lasts, strict=True)]


def test_the_window_is_the_horizon():
    assert RISE_STEPS == HORIZON


def test_warmup_rises_every_step_and_covers_200_steps_past_its_end():
    lr = np.minimum(STEPS / 100, 1.0) * 1e-3  # linear 0 -> 1e-3 over steps 0-100
    assert lr_rise_steps(STEPS, lr).tolist() == list(range(1, 101))
    # the last rise at 100 covers 100..299; step 0 (the first LR) is no rise
    assert covered(in_lr_rise(STEPS, lr)) == [(1, 299)]


def test_constant_lr_never_rises():
    assert not in_lr_rise(STEPS, np.full(STEPS.size, 3e-4)).any()


def test_cosine_decay_never_rises_even_with_jitter_in_the_last_bits():
    lr = 1e-3 * 0.5 * (1 + np.cos(np.pi * STEPS / STEPS[-1]))
    # a scheduler that recomputes the LR: relative noise 1e-9, far under the tolerance
    jitter = 1 + 1e-9 * np.random.default_rng(0).standard_normal(STEPS.size)
    assert lr_rise_steps(STEPS, lr * jitter).size == 0
    assert not in_lr_rise(STEPS, lr * jitter).any()


def test_step_jump_covers_the_jump_and_the_199_steps_after():
    lr = np.where(STEPS < 500, 1e-3, 3e-3)
    assert lr_rise_steps(STEPS, lr).tolist() == [500]
    assert covered(in_lr_rise(STEPS, lr)) == [(500, 699)]


def test_rewarm_after_decay_is_a_second_rise():
    # warmup over 0-50, cosine decay to step 600, then a re-warm over 600-610 to 1e-3
    warm = np.minimum(STEPS / 50, 1.0) * 1e-3
    decay = 1e-3 * 0.5 * (1 + np.cos(np.pi * np.clip(STEPS - 50, 0, 550) / 550))
    lr = np.where(STEPS <= 50, warm, decay)
    rewarm = (STEPS > 600) & (STEPS <= 610)
    lr[rewarm] = lr[600] + (1e-3 - lr[600]) * (STEPS[rewarm] - 600) / 10
    lr[STEPS > 610] = 1e-3
    assert lr_rise_steps(STEPS, lr).tolist() == [*range(1, 51), *range(601, 611)]
    assert covered(in_lr_rise(STEPS, lr)) == [(1, 249), (601, 809)]


def test_a_ramp_under_the_tolerance_row_by_row_counts_once_it_adds_up():
    # 0.3 tolerances a row: no single row clears it, every fourth row's climb does
    lr = 1e-3 * (1 + 0.3 * LR_RISE_TOL) ** np.arange(40)
    assert lr_rise_steps(STEPS[:40], lr).tolist() == [4, 8, 12, 16, 20, 24, 28, 32, 36]


def test_steps_count_not_rows_and_unmeasured_rows_are_skipped():
    steps = np.arange(0, 1000, 10)  # logged every 10 steps
    lr = np.where(steps < 300, 1e-4, 1e-3)
    lr = lr.astype(float)
    lr[30] = np.nan  # step 300 unmeasured: the rise is seen at 310
    mask = in_lr_rise(steps, lr)
    assert steps[mask].tolist() == list(range(310, 510, 10))  # 310 + 190 is the last


def test_no_lr_recorded_is_none():
    assert in_lr_rise(STEPS, np.full(STEPS.size, np.nan)) is None
    assert frame_in_lr_rise(pd.DataFrame({"step": STEPS, "loss": 1.0})) is None
    frame = pd.DataFrame({"step": STEPS, "lr": np.where(STEPS < 10, 0.0, 1e-3)})
    assert covered(frame_in_lr_rise(frame)) == [(10, 209)]


def test_bad_input_says_what_to_fix():
    with pytest.raises(ValueError, match="strictly increasing"):
        in_lr_rise(np.array([0, 2, 1]), np.ones(3))
    with pytest.raises(ValueError, match="at least 1 step"):
        in_lr_rise(STEPS, np.ones(STEPS.size), within=0)


def test_rows_in_lr_rise_reads_each_rows_run_at_its_step():
    # run "a": the LR ramps over steps 0-4, then holds: a rise covers a step when the LR
    # rose within the 200 steps before it (features.rises); run "b" holds its LR from the
    # start (a first value is no rise), run "c" records no LR
    steps = np.arange(0, 600, 50)
    frames = {
        "a": pd.DataFrame({"step": steps, "lr": np.minimum(steps, 200) * 1e-5 + 1e-4}),
        "b": pd.DataFrame({"step": steps, "lr": np.full(steps.size, 1e-3)}),
        "c": pd.DataFrame({"step": steps}),
    }
    groups = np.array(["a", "a", "a", "b", "c", "a"])
    at = np.array([0, 200, 350, 200, 200, 400])
    # "a" rises at 50..200: 0 is its first value (no rise), 200 and 350 within 200 of
    # the last rise at 200; 400 is 200 steps past it: out
    assert rows_in_lr_rise(groups, at, frames).tolist() == [False, True, True, False, False, False]
