"""Event-level metrics on hand-made score traces, and a full report on synthetic runs.

Also the per-kind breakdown and the lead per signal family, on constructed runs whose
answers are known.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from collapse_guard.datasets.runfile import RunMeta
from collapse_guard.predictor.evaluation import (
    FAMILIES,
    HEALTHY_CONTROL,
    UNKNOWN_KIND,
    ScoredRun,
    evaluate_runs,
    event_metrics,
    family_lead_table,
    family_leads,
    healthy_sequences,
    kind_metrics,
    row_metrics,
    threshold_at_budget,
)
from collapse_guard.predictor.levels import episode_counts
from collapse_guard.predictor.training_data import RunRecord


def _run(scores, onset=None, run_id="r", source="synthetic"):
    scores = np.asarray(scores, dtype=float)
    return ScoredRun(run_id, source, np.arange(scores.size), scores, onset)


def _collapsing(alarm_steps, onset=1_000, n=1_100):
    s = np.zeros(n)
    for a, b in alarm_steps:
        s[a:b] = 1.0
    return _run(s, onset)


def test_caught_lead_time_and_false_alarms_follow_the_definition():
    H = 200
    caught = _collapsing([(900, 1_000)])  # first alarm 100 steps ahead
    too_late = _collapsing([(995, 1_000)])  # 5 steps ahead: no time to act
    early = _collapsing([(700, 720), (950, 1_000)])  # one false alarm, then caught at 50
    running = _collapsing([(700, 1_000)])  # starts too early, still on in the window
    healthy = _run(np.r_[np.zeros(100), np.ones(5), np.zeros(100), np.ones(3), np.zeros(792)])
    m = event_metrics([caught, too_late, early, running, healthy], 0.5, horizon=H)
    assert (m["n_collapsed"], m["caught"]) == (4, 3)
    assert sorted(m["lead_times"]) == [50, 100, 200]
    assert m["median_lead"] == 100
    assert m["false_alarms"] == 2 + 1 + 1  # healthy run's two episodes, early's, running's
    assert m["healthy_steps"] == 1_000 + 4 * 800
    assert math.isclose(m["fa_per_10k"], 1e4 * 4 / 4_200)


def test_alarms_after_onset_are_neither_caught_nor_false():
    m = event_metrics([_collapsing([(1_000, 1_100)])], 0.5)
    assert (m["caught"], m["false_alarms"]) == (0, 0)


def test_threshold_at_budget_keeps_false_alarms_within_budget():
    rng = np.random.default_rng(0)
    runs = [_run(rng.random(2_000), run_id=f"h{i}") for i in range(20)]
    runs += [_run(np.r_[rng.random(1_000), np.linspace(1, 2, 100)], onset=1_100, run_id="c")]
    t = threshold_at_budget(runs, budget_per_10k=5.0)
    m = event_metrics(runs, t)
    assert m["fa_per_10k"] <= 5.0 and m["caught"] == 1
    seqs = healthy_sequences(runs)
    values = np.concatenate(seqs)
    lower = values[values < t].max()  # the next lower threshold that changes anything
    assert episode_counts(seqs, np.array([lower]))[0] > 5.0 * m["healthy_steps"] / 1e4


def test_row_metrics_of_a_perfect_scorer():
    s = np.r_[np.zeros(800), np.ones(200)]  # 1 exactly on the H steps before onset
    r = row_metrics([_run(s, onset=1_000), _run(np.zeros(500))], probabilistic=True)
    assert r["pr_auc"] == 1.0 and r["roc_auc"] == 1.0 and r["brier"] == 0.0


def test_report_has_every_scorer_source_and_operating_point(trained):
    _, report = trained
    frame = report.to_frame()
    assert set(frame["scorer"]) == {
        "model",
        "dsi",
        "olmo_zscore",
        "zclip",
        "kill_spike",
        "config_only",
    }
    points = set(frame.loc[frame.scorer == "model", "operating_point"])
    assert points == {"budget", "level:watch", "level:warn", "level:critical"}
    assert set(frame.loc[frame.scorer == "dsi", "operating_point"]) == {"budget", "native"}
    assert set(frame["source"]) == {"all", "synthetic"}
    # at its budget threshold a scorer stays within budget, unless +inf scores (a measured
    # blow-up) alarm at any threshold
    budget_rows = frame[(frame.operating_point == "budget") & (frame.source == "all")]
    within = budget_rows["fa_per_10k"] <= report.budget_per_10k
    assert (within | np.isinf(budget_rows["threshold"])).all()
    assert within[budget_rows.scorer == "model"].all()
    json.dumps(report.to_dict())  # serialisable as is
    metrics = report.to_metrics()
    assert "model/all/budget/recall" in metrics
    assert all(math.isfinite(v) for v in metrics.values())
    assert report.get("model")["n_runs"] == report.get("dsi")["n_runs"] > 0


# --------------------------------------------------------------------------- per kind


def _kinded(alarm_steps, kind, cause, onset=1_000, run_id="c"):
    run = _collapsing(alarm_steps, onset=onset)
    return ScoredRun(run_id, "real", run.steps, run.scores, onset, kind=kind, cause=cause)


def test_kind_metrics_split_recall_and_lead_by_kind_and_cause():
    runs = [
        _kinded([(900, 1_000)], "loss_rise", "entropy_collapse"),  # caught, lead 100
        _kinded([(950, 1_000)], "loss_rise", "fault_lr_jump"),  # caught, lead 50
        _kinded([], "loss_rise", "entropy_collapse"),  # missed
        _kinded([(980, 1_000)], "nonfinite", "divergence"),  # caught, lead 20
        _kinded([(995, 1_000)], "nonfinite", "divergence"),  # too late: missed
        _kinded([(900, 1_000)], None, None),  # a collapse whose metadata names no kind
        _run(np.r_[np.zeros(100), np.ones(5), np.zeros(900)]),  # healthy: not counted
    ]
    by_kind = {r["kind"]: r for r in kind_metrics(runs, 0.5, by="kind")}
    assert list(by_kind) == ["loss_rise", "nonfinite", UNKNOWN_KIND]
    loss_rise = by_kind["loss_rise"]
    assert (loss_rise["n_collapsed"], loss_rise["caught"]) == (3, 2)
    assert math.isclose(loss_rise["recall"], 2 / 3) and loss_rise["median_lead"] == 75
    nonfinite = by_kind["nonfinite"]
    assert (nonfinite["caught"], nonfinite["recall"], nonfinite["median_lead"]) == (1, 0.5, 20)
    assert by_kind[UNKNOWN_KIND]["recall"] == 1.0
    by_cause = {r["kind"]: r for r in kind_metrics(runs, 0.5, by="cause")}
    assert {k: (r["n_collapsed"], r["caught"]) for k, r in by_cause.items()} == {
        "divergence": (2, 1),
        "entropy_collapse": (2, 1),
        "fault_lr_jump": (1, 1),
        UNKNOWN_KIND: (1, 1),
    }
    assert all(r["grouping"] == "cause" for r in by_cause.values())
    # the kinds add up to the whole
    whole = event_metrics(runs, 0.5)
    assert sum(r["caught"] for r in by_kind.values()) == whole["caught"]
    assert sum(r["n_collapsed"] for r in by_kind.values()) == whole["n_collapsed"]


def _record(n, onset=None, extra=None, run_id="r", source="real", **columns):
    frame = pd.DataFrame({"step": np.arange(n), **columns})
    meta = RunMeta(run_id=run_id, source=source, onset_step=onset, extra=extra or {})
    return RunRecord(frame, meta)


def _kind_report():
    """Three collapses (leads 100, missed, 50) and three healthy runs, scored as "model"."""
    n = 1_000
    records, scores = [], []
    for i, (kind, cause, first_alarm) in enumerate(
        [
            ("loss_rise", "entropy_collapse", 700),  # lead 100
            ("loss_rise", "fault_lr_jump", None),  # missed
            ("grad_collapse", "grad_collapse", 750),  # lead 50
        ]
    ):
        extra = {"collapse_kind": kind, "collapse_cause": cause}
        records.append(_record(n, onset=800, extra=extra, run_id=f"c{i}", loss=_wiggle(n)))
        s = np.zeros(n)
        if first_alarm is not None:
            s[first_alarm:800] = 0.9
        scores.append(s)
    for i in range(3):
        records.append(_record(n, extra={"collapse_kind": None}, run_id=f"h{i}", loss=_wiggle(n)))
        scores.append(np.zeros(n))
    return records, evaluate_runs(records, model_scores=scores)


def test_report_by_kind_at_the_same_thresholds_and_backward_compatible():
    _, report = _kind_report()
    assert list(report.to_frame().columns)[:4] == [
        "scorer",
        "source",
        "operating_point",
        "threshold",
    ]
    kinds = report.kind_table("kind")
    assert list(kinds.index) == ["grad_collapse", "loss_rise"]
    assert kinds.loc["loss_rise", "n"] == 2 and kinds.loc["loss_rise", "model recall"] == 0.5
    assert kinds.loc["loss_rise", "model lead"] == 100
    assert kinds.loc["grad_collapse", "model lead"] == 50
    causes = report.kind_table("cause", source="real")
    assert causes["model recall"].to_dict() == {
        "entropy_collapse": 1.0,
        "fault_lr_jump": 0.0,
        "grad_collapse": 1.0,
    }
    frame = report.kinds_frame()
    budget = report.get("model")["threshold"]
    assert (frame.loc[frame.operating_point == "budget", "threshold"] == budget).all()
    assert json.loads(json.dumps(report.to_dict()))["by_kind"]
    metrics = report.to_metrics()
    assert metrics["model/all/budget/kind/loss_rise/recall"] == 0.5
    assert metrics["model/all/budget/cause/fault_lr_jump/n_collapsed"] == 1
    assert "model/all/budget/recall" in metrics  # the old keys stay


# --------------------------------------------------------------------------- family lead


def _wiggle(n, level=1.0, amplitude=0.1):
    # deterministic "noise": |deviation| <= 1.5 std of itself, never 4
    return level + amplitude * np.sin(np.arange(n) * 1.3)


def test_family_lead_is_the_first_departure_from_the_runs_own_range():
    n, onset = 700, 600  # H = 200: range over [200, 400), departures looked for in [400, 600)
    grad = _wiggle(n)
    grad[onset - 120 :] = 5.0  # gradient family departs 120 steps ahead
    cv = _wiggle(n, 0.3, 0.01)
    cv[onset - 30 :] = 0.9  # a second gradient signal, later: the family takes the earliest
    attn = np.full(n, np.nan)
    attn[::50] = _wiggle(n, 2.0, 0.05)[::50]  # sparse: measured every 50 steps
    attn[550] = 0.2  # departs at 550: lead 50
    update = _wiggle(n, 0.5, 0.02)  # measured, never departs
    loss = _wiggle(n, 3.0, 0.05)
    loss[onset - 5] = np.inf  # a measured blow-up departs (too late to warn, though)
    run = _record(
        n,
        onset=onset,
        extra={"collapse_kind": "loss_rise", "collapse_cause": "entropy_collapse"},
        grad_norm=grad,
        grad_cv=cv,
        attn_entropy_min=attn,
        update_cos=update,
        loss=loss,
    )
    leads = family_leads([run], control_rate=None).set_index("family")
    assert set(leads.index) == set(FAMILIES)
    assert leads.loc["gradient", "lead"] == 120
    assert leads.loc["gradient", "first_signal"] == "grad_norm"
    assert leads.loc["gradient", "n_signals"] == 2
    assert leads.loc["attention", "lead"] == 50
    assert leads.loc["output", "lead"] == 5
    assert leads.loc["update", "n_signals"] == 1 and math.isnan(leads.loc["update", "lead"])
    assert leads.loc["amp", "n_signals"] == 0  # not measured at all
    assert (leads["kind"] == "loss_rise").all() and (leads["cause"] == "entropy_collapse").all()

    table = family_lead_table(family_leads([run], control_rate=None)).set_index("family")
    assert table.loc["gradient", "share"] == 1.0 and table.loc["gradient", "median_lead"] == 120
    assert table.loc["output", "warned"] == 0  # 5 steps ahead is less than MIN_LEAD
    assert table.loc["update", "share"] == 0.0 and table.loc["amp", "n"] == 0


def test_family_lead_discounts_signals_that_drift_on_healthy_runs():
    n, onset = 700, 600
    drift = 1.0 + 0.01 * np.arange(n)  # grows all run long: beyond 4 std of any past window
    healthy = [
        _record(n, run_id=f"h{i}", param_norm=drift + i, grad_norm=_wiggle(n)) for i in range(12)
    ]
    grad = _wiggle(n)
    grad[onset - 80 :] = 3.0
    collapse = _record(
        n,
        onset=onset,
        run_id="c",
        extra={"collapse_kind": "grad_collapse"},
        param_norm=drift,
        grad_norm=grad,
    )
    naive = family_leads([collapse, *healthy], control_rate=None)
    calibrated = family_leads([collapse, *healthy])
    for leads, update_departs in ((naive, True), (calibrated, False)):
        row = leads[(leads.run_id == "c")].set_index("family")
        assert (not math.isnan(row.loc["update", "lead"])) == update_departs
        assert row.loc["gradient", "lead"] == 80
    assert calibrated.attrs["n_std"]["param_norm"] > 4.0
    assert calibrated.attrs["n_std"]["grad_norm"] == 4.0
    table = family_lead_table(calibrated).set_index(["kind", "family"])
    # healthy controls come last, one per healthy run, at most 5% departing per signal
    assert family_lead_table(calibrated)["kind"].iloc[-1] == HEALTHY_CONTROL
    assert table.loc[(HEALTHY_CONTROL, "update"), "n"] == 12
    assert table.loc[(HEALTHY_CONTROL, "update"), "share"] <= 0.05 + 1e-9
    assert table.loc[("grad_collapse", "gradient"), "share"] == 1.0


def test_benchmark_tables_from_a_report():
    """benchmarks/predictor_eval.py's per-kind and family tables (the script is no package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "predictor_eval.py"
    spec = importlib.util.spec_from_file_location("predictor_eval", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    records, report = _kind_report()
    rows = {r["kind"]: r for r in bench.kind_rows(report, "kind")}
    assert rows["loss_rise"] == {"kind": "loss_rise", "n": 2, "model": "0.50 (100)"}
    assert rows["grad_collapse"]["model"] == "1.00 (50)"
    leads = family_leads(records)  # a steady loss: nothing departs
    fam = {r["cause"]: r for r in bench.family_rows(report, leads, by="cause")}
    assert list(fam)[-1] == HEALTHY_CONTROL and fam[HEALTHY_CONTROL]["model"] == "—"
    assert fam["fault_lr_jump"]["model"] == "0.00" and fam["fault_lr_jump"]["output"] == "0.00"
    assert fam[HEALTHY_CONTROL]["n"] == 3
    md = bench.markdown_table("t", bench.kind_rows(report, "cause"))
    assert md.splitlines()[2] == "| cause | n | model |"
    (line,) = bench.missed_lines(report, leads, by="kind")
    assert line.startswith("kind loss_rise: model catches 50% of 2")
