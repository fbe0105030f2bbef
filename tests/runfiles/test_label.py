"""The collapse label on hand-made traces (exact onsets) and on real public logs."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.label import (
    LABEL_VERSION,
    Label,
    LabelRule,
    Spike,
    apply_label,
    collapse_targets,
    label_run,
)

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


def test_mid_training_excerpt_counts_from_its_first_step():
    # A log excerpt cut around an event (BigScience 176B chronicle block: iterations
    # 31214-..., spike at 31219): no settle period, the spike 5 steps in is seen.
    loss = np.full(60, 2.20)
    loss[5:10] = 5.10
    label = label_run(_frame(loss, 31214 + np.arange(60)))
    assert (label.onset_step, label.kind) == (None, None)
    (spike,) = label.spikes
    assert (spike.start, spike.peak, spike.end) == (31219, 31219, 31239)
    assert spike.height == pytest.approx(2.9)
    # The same trace at the start of training is inside the settle period.
    assert label_run(_frame(loss)) == Label(None, None)


def test_rise_at_the_end_of_a_short_excerpt_is_too_short_to_tell():
    # A 13B-style block: the loss jumps 40 steps before the excerpt ends (< 50 steps).
    loss = np.full(80, 2.20)
    loss[40:] = 5.10
    assert label_run(_frame(loss, 100_000 + np.arange(80))) == Label(None, None)
    longer = np.full(120, 2.20)
    longer[40:] = 5.10
    assert label_run(_frame(longer, 100_000 + np.arange(120))) == Label(100_040, "loss_rise")


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


# --------------------------------------------------------------------------- reference


def _reference_label(frame: pd.DataFrame, rule: LabelRule) -> tuple:
    """The rule as a plain loop over rows (the first implementation of label_run, before
    it was vectorised): (onset, kind, confirmed, spikes), grad-drop link left out."""
    steps = frame["step"].to_numpy(np.int64)
    loss = frame["loss"].to_numpy(np.float64)
    flagged = frame["loss_nonfinite"].to_numpy(np.float64) == 1.0
    bad = np.isinf(loss) | (flagged & ~np.isfinite(loss))
    measured = np.isfinite(loss) | bad
    first = int(steps[measured][0]) if measured.any() else 0
    settle = rule.settle_steps if first <= rule.settle_steps else 0
    smooth, smooth_step, best, exc, spikes = None, 0, math.inf, None, []

    def back_line() -> float:
        return best + rule.recover_frac * rule.margin(best) if math.isfinite(best) else math.inf

    for step, x, nonfinite in zip(steps.tolist(), loss.tolist(), bad.tolist(), strict=True):
        if exc is not None and step - exc["start"] > rule.window(exc["start"], first):
            return exc["start"], "nonfinite" if exc["bad"] else "loss_rise", step, spikes
        if nonfinite:
            if exc is None:
                exc = {"start": step, "back": back_line(), "best": best, "peak": (step, math.inf)}
                exc.update(rows=1, bad=True)
            elif not exc["bad"]:
                exc["peak"] = (step, math.inf)
            else:
                exc["rows"] += 1
            exc["bad"], smooth = True, None
            continue
        if not math.isfinite(x):
            continue
        if smooth is None:
            smooth = x
        else:
            a = min(1.0 - math.exp(-(step - smooth_step) / rule.smooth_steps), rule.max_row_weight)
            smooth += a * (x - smooth)
        smooth_step = step
        if exc is not None:
            if smooth > exc["back"]:
                exc["rows"] += 1
                if x > exc["peak"][1]:
                    exc["peak"] = (step, x)
                continue
            height = exc["peak"][1] - exc["best"] if math.isfinite(exc["best"]) else math.inf
            spikes.append((exc["start"], exc["peak"][0], step, height))
            exc = None
        settled = step - first >= settle
        if settled and math.isfinite(best) and smooth > best + rule.margin(best):
            exc = {"start": step, "back": back_line(), "best": best, "peak": (step, x)}
            exc.update(rows=1, bad=False)
        else:
            best = min(best, smooth)
    if exc is not None:
        last = int(steps[-1])
        lasted = last - exc["start"] >= rule.tail_min_steps
        if exc["bad"] or (lasted and exc["rows"] >= rule.tail_min_rows):
            return exc["start"], "nonfinite" if exc["bad"] else "loss_rise", last, spikes
    return None, None, None, spikes


def _varied_trace(seed: int) -> pd.DataFrame:
    """A seeded trace mixing what real logs hold: falls, noise, spikes, rises, gaps,
    non-finite losses, sparse logs, excerpts starting mid-training."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 3000))
    every = int(rng.choice([1, 1, 1, 5, 100, 500]))
    start = int(rng.choice([0, 0, 1, 25, 31, 500, 31214]))
    steps = start + every * np.arange(n)
    level = float(rng.choice([1.0, 2.5, 3.3, 8.0]))
    fall = rng.uniform(0, 5) * np.exp(-(steps - start) / rng.uniform(20, 2000)) * (start < 40)
    loss = level + fall + rng.normal(0, rng.choice([0.0, 0.02, 0.1, 0.3]), n)
    for _ in range(rng.integers(0, 6)):
        i = rng.integers(0, n)
        loss[i : i + rng.integers(1, 60)] += rng.uniform(0.2, 5)
    if rng.random() < 0.4:
        i = rng.integers(0, n)
        ramp = np.minimum(1, np.arange(n - i) / rng.uniform(1, 300))
        loss[i:] += rng.uniform(0.1, 2) * ramp
    flag = np.zeros(n)
    if rng.random() < 0.3:
        i = rng.integers(0, n, rng.integers(1, 5))
        loss[i], flag[i] = np.nan, 1.0
    if rng.random() < 0.1:
        i = rng.integers(0, n)
        loss[i:], flag[i:] = np.nan, 1.0
    if rng.random() < 0.2:
        loss[rng.random(n) < 0.3] = np.nan  # not measured
    if rng.random() < 0.05:
        loss[rng.integers(0, n)] = np.inf
    return _frame(loss, steps, loss_nonfinite=flag)


def test_label_matches_the_row_by_row_reference_on_varied_traces():
    rule, kinds, n_spikes = LabelRule(), set(), 0
    for seed in range(300):
        frame = _varied_trace(seed)
        label = label_run(frame, rule)
        onset, kind, confirmed, spikes = _reference_label(frame, rule)
        assert (label.onset_step, label.kind, label.confirmed_step) == (onset, kind, confirmed)
        got = [(s.start, s.peak, s.end) for s in label.spikes]
        assert got == [sp[:3] for sp in spikes], seed
        # the smoothed loss is summed in another order: heights agree to rounding
        heights = [s.height for s in label.spikes]
        assert heights == pytest.approx([sp[3] for sp in spikes], rel=1e-9), seed
        kinds.add(kind)
        n_spikes += len(spikes)
    assert kinds == {None, "nonfinite", "loss_rise"} and n_spikes > 1000
