"""The evaluation inside LR rises and outside: a hand case counted exactly, the bundled
model on real corpus runs it never saw, ``collapse-guard evaluate`` and the benchmark's rows."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from collapse_guard.cli import app
from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.core.seen_runs import SeenRuns
from collapse_guard.predictor.evaluate import (
    RISE_COLUMNS,
    ScoredRun,
    evaluate_runs,
    fold_rise_frame,
    rise_auc,
    rise_result,
)
from collapse_guard.runfiles import RunMeta, read_run, write_run
from collapse_guard.runfiles.records import RunRecord, find_run_files, load_runs
from collapse_guard.signals import SIGNALS

WARN_POINT = "level:warn"
CORPUS = Path(__file__).parents[3] / "corpus" / "real"
N, ONSET = 1_000, 800
STEPS = np.arange(N)


def _scores(*episodes: tuple[int, int]) -> np.ndarray:
    s = np.zeros(N)
    for a, b in episodes:
        s[a:b] = 0.9
    return s


def _hand_runs() -> tuple[list[RunRecord], list[np.ndarray]]:
    """Three runs whose rises, alarms and targets are counted by hand in the tests.

    - ``warm``, healthy: LR warmup over 0-100 (rises at 1-100: in a rise 1-299); alarms
      at 50 and 250 (inside), at 600 (outside);
    - ``jumps``, collapsing at 800 (healthy steps < 600): LR jumps at 300 (in a rise
      300-499) and at 650 (650-849); a false alarm at 450 (inside), caught from 650;
    - ``no_lr``, healthy, no LR column: an alarm at 100, on neither side.
    """
    warm = np.minimum(STEPS / 100, 1.0) * 1e-3
    jumps = np.select([STEPS < 300, STEPS < 650], [1e-4, 2e-4], 4e-4)
    runs = [
        RunRecord(pd.DataFrame({"step": STEPS, "lr": warm}), RunMeta(run_id="warm", source="real")),
        RunRecord(
            pd.DataFrame({"step": STEPS, "lr": jumps}),
            RunMeta(
                run_id="jumps",
                source="real",
                onset_step=ONSET,
                extra={"collapse_kind": "loss_rise"},
            ),
        ),
        RunRecord(
            pd.DataFrame({"step": STEPS, "loss": 2.0}), RunMeta(run_id="no_lr", source="real")
        ),
    ]
    scores = [
        _scores((50, 55), (250, 260), (600, 610)),
        _scores((450, 460), (650, ONSET)),
        _scores((100, 110)),
    ]
    return runs, scores


class _Fixed:
    """A scorer fed known scores, with a stored warn level at 0.5 (set without the runs)."""

    name = "fixed"
    probabilistic = True

    def __init__(self, scores) -> None:
        self._scores = iter(scores)

    def score_run(self, frame):
        return next(self._scores)

    def operating_points(self):
        return {WARN_POINT: 0.5}

    def alarm_run(self, frame):
        return None


# inside: warm's 1-299 (299 healthy steps, 2 false alarms) and jumps' 300-499 (200, 1);
# outside: warm's 0 and 300-999 (701, 1), jumps' 0-299 and 500-599 (400, 0)
HAND = {
    "runs_with_lr": 2,
    "inside_false_alarms": 3,
    "inside_healthy_steps": 499,
    "inside_fa_per_10k": 1e4 * 3 / 499,
    # pre-onset rows inside: 150 positives (jumps 650-799) all at 0.9; 499 negatives, 25
    # at 0.9 (ties count half), 474 at 0
    "inside_roc_auc": (474 + 0.5 * 25) / 499,
    "outside_false_alarms": 1,
    "outside_healthy_steps": 1_101,
    "outside_fa_per_10k": 1e4 / 1_101,
    # outside: 50 positives (jumps 600-649) at 0; 1,101 negatives, 10 at 0.9
    "outside_roc_auc": 0.5 * 1_091 / 1_101,
}


def test_a_hand_case_is_counted_exactly_on_each_side():
    runs, scores = _hand_runs()
    report = evaluate_runs(runs, baselines=[_Fixed(scores)], horizon=200)
    row = report.rise_frame().set_index("operating_point").loc[WARN_POINT]
    assert row["n_runs"] == 3
    for key, value in HAND.items():
        assert row[key] == pytest.approx(value, rel=1e-12), key
    # the split adds up to the whole over the runs with an LR (no_lr's alarm is its own)
    whole = report.result("fixed").events
    assert whole.false_alarms == 3 + 1 + 1 and whole.healthy_steps == 499 + 1_101 + N
    assert whole.caught == 1
    # serialised beside every other figure, NaN-free here
    flat = next(r for r in report.to_dict()["results"] if r["operating_point"] == WARN_POINT)
    assert {k: flat[k] for k in HAND} == pytest.approx(HAND)
    assert "fixed/all/level_warn/inside_roc_auc" in report.to_metrics()


def test_a_scored_run_with_its_rise_mask_given():
    _, scores = _hand_runs()
    warm = ScoredRun("warm", "real", STEPS, scores[0], None, in_rise=(STEPS >= 1) & (STEPS < 300))
    result = rise_result([warm], 0.5, horizon=200)
    assert (result.inside.false_alarms, result.inside.healthy_steps) == (2, 299)
    assert (result.outside.false_alarms, result.outside.healthy_steps) == (1, 701)
    assert math.isnan(result.inside.roc_auc)  # a healthy run alone: no positive rows
    no_lr = ScoredRun("no_lr", "real", STEPS, scores[0], None)
    assert rise_auc([no_lr]) is None and rise_result([no_lr], 0.5) is None


def test_runs_without_an_lr_say_so_and_have_no_split():
    runs, scores = _hand_runs()
    report = evaluate_runs(runs[2:], baselines=[_Fixed(scores[2:])], horizon=200)
    row = report.rise_frame().iloc[0]
    assert row["runs_with_lr"] == 0
    assert all(math.isnan(row[k]) for k in RISE_COLUMNS[1:])
    flat = report.to_dict()["results"][0]
    assert all(flat[k] is None for k in RISE_COLUMNS[1:])  # NaN is null in JSON


def _unseen_corpus_runs(n: int) -> list[RunRecord]:
    """``n`` corpus runs the bundled model never trained or validated on, collapsing
    and healthy both."""
    model = RiskModel.load()
    records = load_runs(find_run_files([CORPUS]))
    unseen, _ = SeenRuns.from_meta(model.meta).partition(r.run_id for r in records)
    by_id = {r.run_id: r for r in records}
    runs = [by_id[i] for i in unseen]
    collapsed = [r for r in runs if r.meta.onset_step is not None]
    healthy = [r for r in runs if r.meta.onset_step is None]
    if len(collapsed) < n // 2 or len(healthy) < n - n // 2:
        pytest.skip(f"corpus/real holds too few runs the bundled model never saw: {len(runs)}")
    return collapsed[: n // 2] + healthy[: n - n // 2]


@pytest.fixture(scope="module")
def bundled_report():
    model = RiskModel.load()
    return model, evaluate_runs(_unseen_corpus_runs(6), model, [])


def test_the_bundled_model_on_unseen_corpus_runs_splits_every_stored_level(bundled_report):
    model, report = bundled_report
    frame = report.rise_frame()
    assert set(frame["operating_point"]) == {f"level:{k}" for k in model.thresholds}
    for _, row in frame.iterrows():
        whole = report.result("model", "all", row["operating_point"]).events
        # every corpus run records its LR: the two sides make the whole
        assert row["runs_with_lr"] == whole.n_runs == 6
        assert row["inside_false_alarms"] + row["outside_false_alarms"] == whole.false_alarms
        assert row["inside_healthy_steps"] + row["outside_healthy_steps"] == whole.healthy_steps
        assert row["inside_healthy_steps"] > 0 and row["outside_healthy_steps"] > 0
        assert 0.0 <= row["inside_roc_auc"] <= 1.0 and 0.0 <= row["outside_roc_auc"] <= 1.0
    # a lower level alarms at least as often on each side
    fa = frame.set_index("operating_point")["inside_false_alarms"]
    assert fa["level:watch"] >= fa["level:warn"] >= fa["level:critical"]


def test_evaluate_prints_the_rows_inside_lr_rises(tmp_path):
    for run in _unseen_corpus_runs(4):
        shutil.copy(run.path, tmp_path)
    paths = sorted(tmp_path.glob("*.parquet"))
    result = CliRunner().invoke(app, ["evaluate", "--runs", str(tmp_path)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "inside LR rises: all sources: 4 of 4 runs record an LR" in said
    assert "FA in FA out AUC in AUC out" in said
    # without an LR the table gives way to one line
    for path in paths:
        frame, meta = read_run(path)
        write_run(path, frame.drop(columns="lr"), meta)
    result = CliRunner().invoke(app, ["evaluate", "--runs", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "no LR recorded in these runs, so no rows inside LR rises" in " ".join(
        result.output.split()
    )


def test_the_benchmark_rows_carry_the_split():
    import predictor_eval as bench  # benchmarks/ is on the tests' path

    runs, scores = _hand_runs()
    report = evaluate_runs(runs, baselines=[_Fixed(scores)], horizon=200)
    (row,) = bench.rise_rows(report)
    assert row["scorer"] == "fixed" and row["runs with LR"] == 2
    assert (row["healthy in rises"], row["healthy outside"]) == (499, 1_101)
    assert row["FA/10k in rises"] == pytest.approx(HAND["inside_fa_per_10k"])
    assert row["AUC outside"] == pytest.approx(HAND["outside_roc_auc"])
    # no LR anywhere: no rows
    none = evaluate_runs(runs[2:], baselines=[_Fixed(scores[2:])], horizon=200)
    assert bench.rise_rows(none) == []


class _Fold:
    def __init__(self, group: str, report) -> None:
        self.group, self.report = group, report


def test_fold_rows_and_their_mean():
    runs, scores = _hand_runs()
    a = evaluate_runs(runs, baselines=[_Fixed(scores)], horizon=200)
    b = evaluate_runs(runs[:1], baselines=[_Fixed(scores[:1])], horizon=200)
    frame = fold_rise_frame([_Fold("a", a), _Fold("b", b)], scorer="fixed")
    assert frame["group"].tolist() == ["a", "b", "mean"]
    mean = frame.set_index("group").loc["mean"]
    assert mean["inside_healthy_steps"] == 499 + 299  # counts add up
    # rates: the unweighted mean of the folds' (b: warm alone, 2 in 299 and 1 in 701)
    assert mean["inside_fa_per_10k"] == pytest.approx((HAND["inside_fa_per_10k"] + 2e4 / 299) / 2)
    assert mean["outside_fa_per_10k"] == pytest.approx((HAND["outside_fa_per_10k"] + 1e4 / 701) / 2)


def _lead_run(run_id, depart_at, lr=None, onset=None):
    """700 steps of a steady gradient norm that jumps at ``depart_at``."""
    grad = 1.0 + 0.1 * np.sin(np.arange(700) * 1.3)  # |deviation| under 1.5 std
    grad[depart_at:] = 5.0
    columns = {"step": np.arange(700), "grad_norm": grad}
    if lr is not None:
        columns["lr"] = lr
    extra = {"collapse_kind": "loss_rise"} if onset is not None else {}
    return RunRecord(
        pd.DataFrame(columns), RunMeta(run_id=run_id, source="real", onset_step=onset, extra=extra)
    )


def test_group_leads_say_whether_a_departure_came_inside_a_rise():
    from group_leads import group_lead_table, group_leads

    steps = np.arange(700)
    jump = np.where(steps < 450, 1e-4, 3e-4)  # in a rise 450-649
    runs = [
        _lead_run("c", 480, jump, onset=600),  # departs at 480: lead 120, inside
        _lead_run("c_flat", 520, np.full(700, 1e-4), onset=600),  # lead 80, outside
        _lead_run("c_no_lr", 500, None, onset=600),  # no LR: neither
        _lead_run("h", 650, jump),  # a healthy run departing at 650: just outside (450 + 200)
    ]
    leads = group_leads(runs, control_rate=None)
    grad = leads[leads["signal_group"] == "gradient"].set_index("run_id")
    assert grad.loc["c", "lead"] == 120 and grad.loc["c", "in_rise"] is True
    assert grad.loc["c_flat", "lead"] == 80 and grad.loc["c_flat", "in_rise"] is False
    assert grad.loc["c_no_lr", "in_rise"] is None
    assert grad.loc["h", "in_rise"] is False
    table = group_lead_table(leads).set_index(["kind", "signal_group"])
    # of the 3 warned collapses, 2 record an LR and 1 of those departed inside a rise
    assert table.loc[("loss_rise", "gradient"), "in_rise"] == 0.5
    assert table.loc[("healthy-control", "gradient"), "in_rise"] == 0.0
    assert math.isnan(table.loc[("loss_rise", "attention"), "in_rise"])  # nothing warned


@pytest.mark.slow
def test_signal_group_ablation_reads_each_variant_inside_rises():
    from group_leads import signal_group_ablation

    records = load_runs(find_run_files([CORPUS]))
    runs = []
    for family in ("gpt", "mha", "rope_swiglu"):  # 4 collapses and 4 healthy runs each
        of = [r for r in records if r.meta.config.get("family") == family]
        runs += [r for r in of if r.meta.onset_step is not None][:4]
        runs += [r for r in of if r.meta.onset_step is None][:4]
    table = signal_group_ablation(runs, drop=["attention"], add=["optimizer"], levels_by=None)
    assert table["signals"].tolist() == ["all", "without attention", "with optimizer"]
    full, without, added = table["n_signals"]
    optimizer_family = [s for s in SIGNALS if s.group == "optimizer"]
    assert without < full and added == full + len(optimizer_family) == full + 10
    for column in ("inside_fa_per_10k", "outside_fa_per_10k"):
        assert (table[column] >= 0).all()
    for column in ("inside_roc_auc", "outside_roc_auc"):
        assert table[column].between(0, 1).all()
    with pytest.raises(ValueError, match="does not read"):
        signal_group_ablation(runs, drop=["colour"])
    with pytest.raises(ValueError, match="the groups the model does not read are"):
        signal_group_ablation(runs, add=["attention"])  # read already
