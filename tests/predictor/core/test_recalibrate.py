"""calibrate: levels set on a user's healthy runs, on hand-made risks where the right
levels are known, and end to end (save, load, MLflow, the command line)."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from documents import blocks
from typer.testing import CliRunner

from collapse_guard.cli import app
from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core.levels import episode_counts
from collapse_guard.predictor.core.recalibrate import (
    MIN_PEAK_SPREAD,
    MIN_TAIL_SLOPE,
    calibrate,
    gumbel_factor,
    healthy_levels,
    steps_needed,
)
from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.core.seen_runs import SeenRuns
from collapse_guard.runfiles import read_meta

# budgets fixed here, not the defaults: the arithmetic below is worked at them
BUDGETS = {"watch": 1_000, "warn": 10_000, "critical": 100_000}


def _expit(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def test_steps_needed_is_the_poisson_bound_of_zero_alarms():
    # zero episodes in N steps bound the rate at -ln(0.1) / N = 2.3026 / N at 90 %
    assert steps_needed(1_000) == 2_303
    assert steps_needed(10_000) == 23_026
    assert steps_needed(100_000) == 230_259
    assert steps_needed(10_000, confidence=0.95) == 29_958  # -ln(0.05) = 2.9957


def test_one_spike_a_run_puts_a_certified_watch_just_above_it_and_extrapolates_the_rest():
    # 10 runs of 1,000 steps at risk 0.1, one step of each at 0.5.
    # watch (1/1,000): runs as long as the budget, so on steps: at 0.1 or 0.5 there are 10
    # episodes; their 90 % bound chi2.ppf(0.9, 22) / 20,000 = 1.54e-3 > 1e-3; above 0.5
    # none: 2.30 / 10,000 = 2.3e-4 <= 1e-3
    runs = []
    for k in range(10):
        risk = np.full(1_000, 0.1)
        risk[100 + 50 * k] = 0.5
        runs.append(risk)
    levels = healthy_levels(runs, BUDGETS)
    assert levels["watch"].threshold == np.nextafter(0.5, np.inf)
    assert levels["watch"].certified and levels["watch"].episodes == 0
    assert levels["watch"].basis == "steps"
    # warn and critical: a new run may alarm with 10 % and 1 %; 10 runs certify neither
    # (22 and 230 runs needed). Every peak is 0.5: their log-odds 0 plus the Gumbel
    # tolerance factor times the least spread, 0.1
    for level, target in (("warn", 0.1), ("critical", 0.01)):
        evidence = levels[level]
        assert evidence.basis == "runs" and not evidence.certified
        assert evidence.run_target == pytest.approx(target)
        assert evidence.threshold == pytest.approx(
            _expit(gumbel_factor(10, target, 0.9) * MIN_PEAK_SPREAD), rel=1e-12
        )
        assert evidence.exceedance_bound == pytest.approx(1 - 0.1**0.1)  # 0.206
        assert evidence.alarmed_runs == 0 and evidence.expected_exceedance == 1 / 11
    assert levels["warn"].runs_needed == 22 and levels["warn"].steps_needed == 23_026
    assert levels["warn"].healthy_steps == 10_000


def test_certified_level_holds_its_budget_on_fresh_healthy_steps():
    # i.i.d. uniform risks: an episode starts at step i when r_(i-1) < t <= r_i, at the
    # rate t (1 - t); the budget of 1/1,000 needs t >= 0.999. 200,000 steps certify it.
    rng = np.random.default_rng(0)
    level = healthy_levels([rng.random(200_000)], BUDGETS)["watch"]
    assert level.certified
    assert 0.999 < level.threshold < 0.9994  # the bound costs little at 200 episodes
    fresh = [rng.random(100_000) for _ in range(10)]
    (episodes,) = episode_counts(fresh, np.array([level.threshold]))
    assert episodes / 1_000_000 < 1e-3


def test_flat_tails_rise_at_least_the_floor_slope_and_nan_never_alarms():
    # one run: NaN (no window yet), then a constant risk: no tail to read
    risk = np.concatenate([np.full(50, np.nan), np.full(950, 0.2)])
    levels = healthy_levels([risk], BUDGETS)
    top = math.log(0.2 / 0.8)
    # watch: 950 steps certify nothing (2,303 needed): log10(2,303 / 1,000) decades up
    assert levels["watch"].threshold == pytest.approx(
        _expit(top + MIN_TAIL_SLOPE * math.log10(2_303 / 1_000)), rel=1e-6
    )
    assert levels["watch"].healthy_steps == 1_000
    assert levels["watch"].threshold < levels["warn"].threshold < levels["critical"].threshold


def test_calibrated_levels_catch_what_the_stored_ones_miss():
    # a set-up whose healthy risk sits near 0.1 and whose pre-collapse risk reaches 0.4:
    # levels set on another set-up's scale (0.8) never warn, its own do
    rng = np.random.default_rng(1)
    healthy = [_expit_array(rng.normal(-2.2, 0.15, 2_000)) for _ in range(10)]
    levels = healthy_levels(healthy, BUDGETS)
    assert levels["warn"].threshold < 0.4 < 0.8
    fresh = [_expit_array(rng.normal(-2.2, 0.15, 2_000)) for _ in range(20)]
    (false_alarms,) = episode_counts(fresh, np.array([levels["warn"].threshold]))
    assert false_alarms <= 4  # 40,000 healthy steps: the budget allows 4


def _expit_array(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


# ------------------------------------------------------------------ with real models


@pytest.fixture(scope="module")
def bundled():
    return RiskModel.load()


@pytest.fixture(scope="module")
def healthy_fresh(fresh_paths):
    return [p for p in fresh_paths if read_meta(p).onset_step is None]


@pytest.fixture(scope="module")
def tuned(bundled, healthy_fresh):
    return calibrate(bundled, healthy_fresh)


def test_calibrate_keeps_the_booster_and_names_its_runs(bundled, tuned, healthy_fresh, tmp_path):
    assert len(healthy_fresh) >= 5
    base = bundled.meta["version"]
    assert tuned.meta["version"] == f"{base}-cal-{tuned.fingerprint()[:8]}"
    assert tuned.meta["base_version"] == base
    ids = sorted(read_meta(p).run_id for p in healthy_fresh)
    assert tuned.meta["calibrated_on"] == ids
    # evaluation refuses them now: the levels were set on them
    assert all(SeenRuns.from_meta(tuned.meta).role_of(i) == "validation" for i in ids)
    assert tuned.thresholds != bundled.thresholds
    assert tuned.hold_steps == bundled.hold_steps and tuned.horizon == bundled.horizon
    frame = pd.read_parquet(healthy_fresh[0])
    np.testing.assert_array_equal(tuned.predict_run(frame), bundled.predict_run(frame))
    loaded = RiskModel.load(tuned.save(tmp_path / "tuned"))
    assert loaded.thresholds == tuned.thresholds
    assert loaded.meta["version"] == tuned.meta["version"]
    assert loaded.meta["levels_evidence"]["warn"]["steps_needed"] == 11_513  # 1 per 5,000
    # the method is the function
    assert bundled.calibrate(healthy_fresh).thresholds == tuned.thresholds


def test_every_calibration_run_stays_under_its_new_warn_level_but_for_the_budget(
    tuned, healthy_fresh
):
    steps = alarms = 0
    for path in healthy_fresh:
        frame = pd.read_parquet(path)
        risk = tuned.predict_run(frame, steps=frame["step"].to_numpy()).to_numpy()
        steps += risk.size
        alarms += int(episode_counts([risk], np.array([tuned.thresholds["warn"]]))[0])
    assert alarms <= math.floor(steps / 10_000)


def test_calibrate_refuses_collapsed_runs_naming_them(bundled, fresh_paths):
    collapsed = [p for p in fresh_paths if read_meta(p).onset_step is not None]
    with pytest.raises(UserInputError, match=rf"{len(collapsed)} of {len(fresh_paths)} .*onset"):
        calibrate(bundled, fresh_paths)


def test_calibrate_labels_an_unlabelled_frame_and_refuses_its_collapse(bundled):
    # 600 steps at loss 2.5, then 5.0 to the end: the label's rule finds the rise
    frame = pd.DataFrame(
        {"step": np.arange(1_000), "loss": np.r_[np.full(600, 2.5), np.full(400, 5.0)]}
    )
    frame.attrs["run_id"] = "mine"
    with pytest.raises(UserInputError, match=r"mine \(onset at step 6\d\d\)"):
        calibrate(bundled, [frame])


def test_calibrate_refuses_runs_the_model_trained_on(bundled, healthy_fresh):
    trained_on = sorted(SeenRuns.from_meta(bundled.meta).train)[0]
    frame = pd.read_parquet(healthy_fresh[0])
    frame.attrs["run_id"] = trained_on
    with pytest.raises(UserInputError, match=rf"trained on: {trained_on}"):
        calibrate(bundled, [frame])


def test_calibrate_command_writes_a_model_and_says_what_backs_each_level(
    healthy_fresh, fresh_paths, tmp_path
):
    runner = CliRunner()
    out = tmp_path / "mine"
    result = runner.invoke(
        app, ["calibrate", "--runs", *map(str, healthy_fresh), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    # 22 healthy runs of about 860 steps: watch (a new run may alarm with 86 %) and warn
    # (17 %: the bundled model's budget, 1 per 5,000) certified, critical (0.86 %) not: 267
    # runs would certify it
    assert "certified" in result.output and "267 runs certify it" in result.output
    tuned = RiskModel.load(out)
    assert tuned.meta["base_version"] == RiskModel.load().meta["version"]
    notes = {level: e["note"] for level, e in tuned.meta["levels_evidence"].items()}
    assert notes["critical"].startswith(
        "critical: not certified: 22 healthy runs certify at most a 9.9% chance that a new run "
        "alarms (90% confidence; 4.3% expected); its budget, 1 false alarm per 100,000 steps "
        "over runs of 859 steps, is a 0.86% chance; 245 more healthy runs, none reaching it, "
        "would certify that"
    )
    lines = result.output.splitlines()
    assert notes["critical"] in lines  # one line, as stored
    # certified: no warning
    assert not any(line.startswith(("watch:", "warn:")) for line in lines)
    again = runner.invoke(
        app, ["calibrate", "--runs", str(fresh_paths[0].parent), "--out", str(tmp_path / "x")]
    )
    assert again.exit_code == 2
    assert "collapsed" in again.output and "Traceback" not in again.output
    # a confidence out of range: one line, before any run is read (a missing folder passes)
    bad = runner.invoke(
        app, ["calibrate", "--runs", str(tmp_path / "nowhere"), "--out", str(tmp_path / "y"),
              "--confidence", "1.5"],
    )  # fmt: skip
    assert bad.exit_code == 2 and "confidence must be in (0, 1), got 1.5" in bad.output
    taken = runner.invoke(app, ["calibrate", "--runs", *map(str, healthy_fresh), "--out", str(out)])
    assert taken.exit_code == 2 and "not empty" in taken.output


def test_the_readme_example_runs_as_written(healthy_fresh, tmp_path, monkeypatch):
    start = "from collapse_guard.predictor import RiskModel\nmine"
    (block,) = [b for b in blocks("py") if b.startswith(start)]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "healthy").mkdir(parents=True)
    for path in healthy_fresh:
        shutil.copy(path, tmp_path / "runs" / "healthy")
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert RiskModel.load("models/my-setup").thresholds == namespace["mine"].thresholds
    assert namespace["mine"].meta["levels_evidence"]["warn"]["healthy_steps"] > 0


# ------------------------------------------------------------------ hostile runs (issue 31)


def _hostile_copy(source: Path, target: Path, run_id: str, rows=None, steps=None) -> Path:
    """``source`` written again as ``target`` under ``run_id``, raw (no RunWriter, which
    refuses what these hold): its first ``rows`` rows, its steps changed by ``steps``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from collapse_guard.runfiles import META_KEY

    table = pq.read_table(source)
    if rows is not None:
        table = table.slice(0, rows)
    if steps is not None:
        values = table.column("step").to_numpy().copy()
        steps(values)
        table = table.set_column(0, "step", pa.array(values, type=pa.int64()))
    meta = read_meta(source)
    meta.run_id = run_id
    metadata = {**table.schema.metadata, META_KEY.encode(): meta.to_json().encode()}
    pq.write_table(table.replace_schema_metadata(metadata), target)
    return target


def _repeat_step_5(steps):
    steps[5] = steps[4]


def _step_5_back(steps):
    steps[5] = steps[3]


HOSTILE = {
    "empty": ({"rows": 0}, r"1 of 3 calibration runs have no rows: mine-bad \(.*bad\.parquet\)"),
    "repeated": (
        {"steps": _repeat_step_5},
        r"bad\.parquet \(run 'mine-bad'\): steps must strictly increase; row 5 has step \d+, "
        r"which repeats step \d+ of row 4",
    ),
    "decreasing": (
        {"steps": _step_5_back},
        r"bad\.parquet \(run 'mine-bad'\): steps must strictly increase; row 5 has step \d+, "
        r"which goes back from step \d+ of row 4",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_calibrate_refuses_an_empty_or_unordered_run_naming_its_file(
    case, bundled, healthy_fresh, tmp_path
):
    changes, message = HOSTILE[case]
    runs = tmp_path / "runs"
    runs.mkdir()
    for path in healthy_fresh[:2]:
        shutil.copy(path, runs)
    _hostile_copy(healthy_fresh[2], runs / "bad.parquet", "mine-bad", **changes)
    with pytest.raises(UserInputError, match=message):
        calibrate(bundled, [runs])
    result = CliRunner().invoke(
        app, ["calibrate", "--runs", str(runs), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()  # one line, no traceback
    assert line.startswith("error: ") and re.search(message, line), line
    assert not (tmp_path / "o").exists()


def test_calibrate_refuses_copies_of_one_run_naming_each_pair(bundled, healthy_fresh, tmp_path):
    # 3 files of one run under other names and run ids: one run's healthy steps, not three
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(healthy_fresh[1], runs)
    for i in range(3):
        _hostile_copy(healthy_fresh[0], runs / f"copy{i}.parquet", f"copy-{i}")
    message = (
        r"2 of 4 calibration runs hold the same steps and signals as another \(the same "
        r"content fingerprint\): copy-1 \(.*copy1\.parquet\) is a copy of copy-0 "
        r"\(.*copy0\.parquet\), copy-2 \(.*copy2\.parquet\) is a copy of copy-0 .*"
        r"remove the copy"
    )
    with pytest.raises(UserInputError, match=message):
        calibrate(bundled, [runs])
    result = CliRunner().invoke(
        app, ["calibrate", "--runs", str(runs), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ") and re.search(message, line), line
    # one copy fewer is still a copy; with one file of the run left it calibrates
    (runs / "copy2.parquet").unlink()
    with pytest.raises(UserInputError, match="1 of 3 calibration runs hold the same"):
        calibrate(bundled, [runs])
    (runs / "copy1.parquet").unlink()
    assert calibrate(bundled, [runs]).meta["calibrated_on"] == sorted(
        ["copy-0", read_meta(healthy_fresh[1]).run_id]
    )


def test_calibrate_refuses_frames_that_copy_or_disorder_a_run(bundled, healthy_fresh):
    frame = pd.read_parquet(healthy_fresh[0])
    copy = frame.copy()
    copy.attrs["run_id"] = "again"
    with pytest.raises(UserInputError, match=r"again is a copy of frame-0"):
        calibrate(bundled, [frame, copy])
    # a signal a frame lacks is one it did not measure: NaN, as the reader gives it
    mine = frame[["step", "loss", "grad_norm"]]
    with pytest.raises(UserInputError, match=r"again is a copy of mine"):
        calibrate(bundled, {"mine": mine, "again": mine.assign(sharpness=np.nan)})
    backwards = frame.iloc[::-1].reset_index(drop=True)
    backwards.attrs["run_id"] = "backwards"
    with pytest.raises(UserInputError, match=r"calibration run backwards: steps must strictly"):
        calibrate(bundled, [backwards])
    with pytest.raises(UserInputError, match=r"1 of 1 calibration runs have no rows: empty"):
        calibrate(bundled, {"empty": frame.iloc[:0]})
