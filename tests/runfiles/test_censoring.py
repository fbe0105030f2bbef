"""Censoring a guarded run: actions that leave the outcome known keep their rows, a rescue is a
caught collapse, an intervention censors what it may have changed (guard_label_effect.py)."""

from __future__ import annotations

import math

import pytest
from test_ingest import TAIL, guarded, intervene, loss_trace

from collapse_guard.runfiles.censoring import censor_guarded, first_intervention, first_rescue
from collapse_guard.runfiles.label import HORIZON, label_run


@pytest.mark.parametrize(
    "event",
    [
        "qk_clip:blocks.0.attn.2x0.8123",
        "skip:loss_z=7.1",
        "skip:grad_z=6.4;checkpoint",
        "accept:loss_z=8",
    ],
)
def test_actions_that_leave_the_outcome_known_keep_every_row(event):
    frame = intervene(loss_trace(), 500, event)
    kept, meta, censoring = censor_guarded(frame, guarded("g", frame))
    assert first_intervention(frame) is None and first_rescue(frame) is None
    assert len(kept) == 1500 and not censoring.censored and meta.onset_step is None


@pytest.mark.parametrize(
    "event",
    ["lr_x0.5", "lr_hold:0.021", "clip_layers:3", "skip:nonfinite_grad", "data_changed;checkpoint"],
)
def test_an_intervention_censors_the_rows_whose_horizon_reaches_it(event):
    # a level's LR change, warn's hold (the default) or a layer clip, a skipped NaN update:
    # each may avert a collapse; the loop's new data (Guard.data_changed) makes the loss
    # jump, which the label would read as an onset
    frame = intervene(intervene(loss_trace(), 300, "qk_clip:h.0x0.9"), 900, event)
    kept, _, censoring = censor_guarded(frame, guarded("g", frame))
    assert censoring.first_intervention == 900
    assert kept["step"].max() == 900 - TAIL - HORIZON - 1 == 649


def test_a_rescue_of_a_collapse_that_developed_keeps_the_rows_up_to_it_as_collapsing():
    # stuck at 6 nats from step 1000; the LR halved at 950 did not save it; the guard
    # rescues 30 steps into the excursion (collapse_confirm_steps) and rolls back
    frame = intervene(loss_trace(collapse_at=1000), 950, "lr_x0.5")
    frame = intervene(frame, 1030, "rescue:online_collapse;rollback:avg3@900;skip_batches:20")
    kept, meta, censoring = censor_guarded(frame, guarded("g", frame))
    assert censoring.rescue == 1030 and censoring.first_intervention == 950
    assert kept["step"].max() == 1030  # after it: another trajectory
    # the excursion is 31 steps old at the rescue: the plain rule (tail 50) sees nothing yet,
    # the rescue's label the step where the smoothed loss crossed best + margin
    assert label_run(kept[kept["step"] >= 800]).onset_step is None
    assert meta.onset_step == 1000 and meta.extra["rescue"]["onset_from"] == "label"
    # the LR change at 950 may have delayed the onset: rows 700-799 (t + H >= 950 - tail,
    # t < 1000 - H) could have been within H of the run's own onset, so they are dropped
    steps = set(kept["step"])
    assert steps == set(range(700)) | set(range(800, 1031)) and censoring.rows_kept == 931


def test_a_rescue_after_an_intervention_in_the_collapse_keeps_every_row_up_to_it():
    frame = intervene(loss_trace(collapse_at=1000), 1010, "lr_x0.5")
    frame = intervene(frame, 1030, "rescue:online_collapse")
    kept, meta, _ = censor_guarded(frame, guarded("g", frame))
    assert len(kept) == 1031 and meta.onset_step == 1000


def test_a_rescue_of_a_nonfinite_loss_has_its_onset_at_that_step():
    frame = loss_trace()
    frame.loc[frame["step"] == 700, "loss"] = math.inf
    frame = intervene(frame, 700, "rescue:nonfinite_loss")
    kept, meta, _ = censor_guarded(frame, guarded("g", frame))
    assert meta.onset_step == 700 and meta.extra["collapse_kind"] == "nonfinite"
    assert len(kept) == 701


def test_a_rescue_with_no_excursion_open_has_its_onset_at_the_rescue():
    # outliers right after an LR jump: rescued before the smoothed loss moved
    frame = intervene(loss_trace(), 800, "rescue:outliers_after_lr_jump")
    _, meta, censoring = censor_guarded(frame, guarded("g", frame))
    assert meta.onset_step == censoring.rescue == 800
    assert meta.extra["rescue"] == {"step": 800, "onset_from": "trigger"}
