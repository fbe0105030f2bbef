"""The collapse label on hand-made traces (exact onsets) and on real public logs."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collapse_guard.datasets.label import (
    LABEL_VERSION,
    Label,
    LabelRule,
    Spike,
    apply_label,
    collapse_targets,
    label_run,
)
from collapse_guard.datasets.runfile import RunMeta

REALDATA = Path(__file__).resolve().parents[3] / "shared" / "realdata"


def _frame(loss, steps=None, **columns) -> pd.DataFrame:
    loss = np.asarray(loss, dtype=float)
    steps = np.arange(len(loss)) if steps is None else np.asarray(steps)
    return pd.DataFrame({"step": steps, "loss": loss, **columns})


def _flat(n: int, level: float = 2.5) -> np.ndarray:
    return np.full(n, level)


def test_nonfinite_loss_is_onset_at_first_nonfinite_step():
    loss = _flat(320)
    loss[300:] = np.nan
    flag = np.where(np.arange(320) >= 300, 1.0, 0.0)
    label = label_run(_frame(loss, loss_nonfinite=flag))
    assert (label.onset_step, label.kind) == (300, "nonfinite")
    # An infinite loss is measured even without the flag column; the run may stop there.
    loss = _flat(301)
    loss[300] = math.inf
    assert label_run(_frame(loss)) == Label(300, "nonfinite")


def test_single_nonfinite_step_that_recovers_is_a_spike():
    loss, flag = _flat(600), np.zeros(600)
    loss[300], flag[300] = np.nan, 1.0
    label = label_run(_frame(loss, loss_nonfinite=flag))
    assert label.onset_step is None and label.kind is None
    assert label.spikes == (Spike(start=300, peak=300, end=301, height=math.inf),)


def test_sustained_rise_onset_where_smoothed_loss_crosses_the_margin():
    loss = _flat(1000)
    loss[500:] = 3.5
    # EWMA (10 steps) of a 1-nat step passes the 0.25 margin on the third step:
    # 1 - exp(-0.3) = 0.26.
    label = label_run(_frame(loss))
    assert (label.onset_step, label.kind, label.spikes) == (502, "loss_rise", ())


def test_spike_that_recovers_is_recorded_not_a_collapse():
    loss = _flat(1000)
    loss[400:405] = [4.0, 6.0, 5.0, 4.0, 3.0]
    label = label_run(_frame(loss))
    assert label.onset_step is None and not label.collapsed
    (spike,) = label.spikes
    assert (spike.start, spike.peak) == (401, 401)
    assert spike.height == pytest.approx(3.5)
    assert spike.end == 415  # excess 1.72 nats at 404 decays below 0.25 in 11 steps


def test_one_step_data_spikes_do_not_register():
    # modded-nanogpt: single-step spikes of 1-1.3 nats at fixed steps, gone next step.
    loss = _flat(2000, 3.3)
    loss[[919, 947, 1335]] += 1.3
    assert label_run(_frame(loss)) == Label(None, None)


def test_slow_drift_up_that_never_recovers():
    steps = np.arange(2000)
    loss = np.where(steps < 600, 2.5, 2.5 + 0.001 * (steps - 600))
    label = label_run(_frame(loss))
    # The raw loss passes 2.75 at step 850; the 10-step EWMA lags it by ~10 steps.
    assert (label.onset_step, label.kind) == (860, "loss_rise")


def test_gradient_norm_collapse_with_loss_stuck_high():
    loss, grad = _flat(1000), np.ones(1000)
    loss[500:], grad[500:] = 3.2, 5e-4  # grad norm down 2000x in one step
    label = label_run(_frame(loss, grad_norm=grad))
    # The loss crosses the margin at 504; the drop at 500 is where learning stopped.
    assert (label.onset_step, label.kind) == (500, "grad_collapse")


def test_gradient_drop_with_loss_at_its_best_is_not_a_collapse():
    grad = np.ones(1000)
    grad[500:] = 1e-4
    assert label_run(_frame(_flat(1000), grad_norm=grad)).onset_step is None


def test_healthy_noisy_seeded_run_has_no_onset():
    rng = np.random.default_rng(0)
    steps = np.arange(3000)
    loss = 2.5 + 3.0 * np.exp(-steps / 300) + rng.normal(0, 0.1, steps.size)
    label = label_run(_frame(loss, grad_norm=rng.lognormal(0, 0.3, steps.size)))
    assert label == Label(None, None)


def test_nan_gaps_are_skipped_not_filled():
    loss = _flat(1000)
    loss[500:] = 3.5
    loss[480:521] = np.nan  # not measured (no loss_nonfinite flag)
    label = label_run(_frame(loss, loss_nonfinite=np.zeros(1000)))
    # The EWMA decays over the 42-step gap: first measured step after it is the onset.
    assert (label.onset_step, label.kind) == (521, "loss_rise")
    # Scattered unmeasured rows in a healthy run change nothing.
    rng = np.random.default_rng(1)
    healthy = 2.5 + rng.normal(0, 0.05, 2000)
    healthy[rng.random(2000) < 0.3] = np.nan
    assert label_run(_frame(healthy)) == Label(None, None)


def test_logs_every_100_steps():
    steps = np.arange(0, 20001, 100)
    loss = 2.0 + 6.0 * np.exp(-steps / 2000)
    spiky = loss.copy()
    spiky[steps == 8000] += 3.0
    label = label_run(_frame(spiky, steps))
    assert label.onset_step is None
    assert [(s.start, s.peak, s.end) for s in label.spikes] == [(8000, 8000, 8100)]
    rising = loss.copy()
    rising[steps >= 12000] += 1.0
    assert label_run(_frame(rising, steps)) == Label(12000, "loss_rise")


def test_rise_at_the_very_end_counts_only_if_it_lasted():
    short = _flat(1000)
    short[990:] = 3.5  # crosses at 992, 7 steps before the end: too short to tell
    assert label_run(_frame(short)).onset_step is None
    long = _flat(1000)
    long[900:] = 3.5  # crosses at 902 and stays 97 steps: >= tail_min_steps (50)
    assert label_run(_frame(long)) == Label(902, "loss_rise")


def test_early_fast_fall_and_first_step_overshoot_do_not_count():
    steps = np.arange(1500)
    loss = 2.5 + 8.0 * np.exp(-steps / 100)
    loss[1:5] += 0.8  # the first optimizer steps overshoot before the loss falls
    assert label_run(_frame(loss)).onset_step is None


def test_margin_is_relative_for_large_losses():
    rule = LabelRule()
    assert rule.margin(2.0) == 0.25 and rule.margin(8.0) == pytest.approx(0.8)
    loss = _flat(2000, 8.0)
    loss[1000:] = 8.6  # +0.6 nats at a level of 8: under 10%, not a collapse
    assert label_run(_frame(loss)).onset_step is None


def test_bad_input_is_rejected_with_a_clear_message():
    with pytest.raises(ValueError, match="needs columns 'step' and 'loss'"):
        label_run(pd.DataFrame({"step": [0]}))
    with pytest.raises(ValueError, match="strictly increase"):
        label_run(_frame([1.0, 1.0], steps=[5, 5]))
    assert label_run(_frame([])) == Label(None, None)


def test_collapse_targets_small_example():
    y, usable = collapse_targets([0, 100, 200, 300, 400], onset_step=300, horizon=200)
    assert y.dtype == np.int8 and usable.dtype == bool
    assert y.tolist() == [0, 1, 1, 0, 0]
    assert usable.tolist() == [True, True, True, False, False]
    y, usable = collapse_targets(np.arange(3), None)
    assert y.tolist() == [0, 0, 0] and usable.all()
    with pytest.raises(ValueError, match="horizon"):
        collapse_targets([0], 1, horizon=0)


def test_apply_label_sets_meta_fields():
    meta = RunMeta(run_id="r", source="synthetic", extra={"fault": "none"})
    label = Label(40, "loss_rise", (Spike(1, 2, 3, 0.5),))
    out = apply_label(meta, label)
    assert (out.onset_step, out.label_version) == (40, LABEL_VERSION)
    assert out.extra == {
        "fault": "none",
        "collapse_kind": "loss_rise",
        "spikes": [{"start": 1, "peak": 2, "end": 3, "height": 0.5}],
    }
    assert meta.onset_step is None  # the original is left alone


# --------------------------------------------------------------------------- real logs


def _algoperf_trace(path: Path) -> pd.DataFrame:
    """step and per-batch training loss of an AlgoPerf measurements.csv (eval rows dropped)."""
    steps, losses = [], []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("loss"):
                step = int(float(row["global_step"]))
                if not steps or step > steps[-1]:
                    steps.append(step)
                    losses.append(float(row["loss"]))
    return _frame(losses, steps)


def _algoperf_events() -> dict[str, list[dict]]:
    events_csv = REALDATA / "derived" / "algoperf_events.csv"
    if not events_csv.exists():
        pytest.skip(f"real logs not present at {REALDATA}")
    by_run: dict[str, list[dict]] = defaultdict(list)
    with open(events_csv, newline="") as handle:
        for row in csv.DictReader(handle):
            by_run[row["path"]].append(row)
    return by_run


def test_algoperf_recovered_spikes_get_no_onset():
    # Spikes after the early phase that came back within 1,000 steps (derived table):
    # the label must not put an onset on or just before them.
    checked, wrong = 0, []
    for path, events in sorted(_algoperf_events().items())[:60]:
        ok = [
            e
            for e in events
            if e["recovered"] == "True"
            and int(e["event_step"]) >= 1000
            and float(e["steps_to_recover"]) <= 1000
        ]
        if not ok:
            continue
        label = label_run(_algoperf_trace(REALDATA / "submissions_algorithms" / path))
        for e in ok:
            start, back = int(e["event_step"]), int(float(e["steps_to_recover"]))
            checked += 1
            if label.onset_step is not None and start - 1000 <= label.onset_step <= start + back:
                wrong.append((path, start, label.onset_step))
    assert checked >= 20
    assert not wrong, wrong


def test_algoperf_divergence_is_found():
    # nadamw_sequential Conformer: loss from ~1.0 to ~32 at step 80,000, never back.
    events = _algoperf_events()
    paths = [
        p
        for p, es in events.items()
        if any(e["recovered"] == "False" and e["event_step"] == "80000" for e in es)
    ]
    assert paths
    for path in paths:
        label = label_run(_algoperf_trace(REALDATA / "submissions_algorithms" / path))
        assert label.collapsed and 79900 <= label.onset_step <= 80000, (path, label)
