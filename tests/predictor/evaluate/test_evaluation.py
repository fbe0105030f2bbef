"""Event-level metrics on hand-made score traces, and a full report on synthetic runs.

Also the per-kind breakdown and the lead per signal group, on constructed runs whose
answers are known.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from group_leads import (
    HEALTHY_CONTROL,
    SIGNAL_GROUPS,
    group_lead_table,
    group_leads,
    setup_lead_table,
)
from separability import permuted_targets, separability

from collapse_guard.predictor.core.levels import episode_counts
from collapse_guard.predictor.evaluate import (
    UNKNOWN,
    RunOutcome,
    ScoredRun,
    evaluate_runs,
    event_metrics,
    group_metrics,
    healthy_sequences,
    row_metrics,
    run_outcome,
    threshold_at_budget,
)
from collapse_guard.runfiles import RunMeta
from collapse_guard.runfiles.records import RunRecord


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
    assert (m.n_collapsed, m.caught) == (4, 3)
    assert sorted(m.lead_times) == [50, 100, 200]
    assert m.median_lead == 100
    assert m.false_alarms == 2 + 1 + 1  # healthy run's two episodes, early's, running's
    assert m.healthy_steps == 1_000 + 4 * 800
    assert math.isclose(m.fa_per_10k, 1e4 * 4 / 4_200)
    # per run, typed: lead (None when missed), false alarms, healthy steps
    assert run_outcome(early, 0.5, H) == RunOutcome(lead=50, false_alarms=1, healthy_steps=800)
    assert run_outcome(too_late, 0.5, H) == RunOutcome(None, 0, 800)
    assert run_outcome(healthy, 0.5, H) == RunOutcome(None, 2, 1_000)


def test_alarms_after_onset_are_neither_caught_nor_false():
    m = event_metrics([_collapsing([(1_000, 1_100)])], 0.5)
    assert (m.caught, m.false_alarms) == (0, 0)


def test_threshold_at_budget_keeps_false_alarms_within_budget():
    rng = np.random.default_rng(0)
    runs = [_run(rng.random(2_000), run_id=f"h{i}") for i in range(20)]
    runs += [_run(np.r_[rng.random(1_000), np.linspace(1, 2, 100)], onset=1_100, run_id="c")]
    t = threshold_at_budget(runs, budget_per_10k=5.0)
    m = event_metrics(runs, t)
    assert m.fa_per_10k <= 5.0 and m.caught == 1
    seqs = healthy_sequences(runs)
    values = np.concatenate(seqs)
    lower = values[values < t].max()  # the next lower threshold that changes anything
    assert episode_counts(seqs, np.array([lower]))[0] > 5.0 * m.healthy_steps / 1e4


def test_row_metrics_of_a_perfect_scorer():
    s = np.r_[np.zeros(800), np.ones(200)]  # 1 exactly on the H steps before onset
    r = row_metrics([_run(s, onset=1_000), _run(np.zeros(500))], probabilistic=True)
    assert r.pr_auc == 1.0 and r.roc_auc == 1.0 and r.brier == 0.0
    # a constant 0.5 scores Brier 0.25 whatever the targets
    half = row_metrics([_run(np.full(1_000, 0.5), onset=1_000)], probabilistic=True)
    assert half.brier == 0.25


def test_report_has_every_scorer_source_and_operating_point(trained):
    model, report = trained
    frame = report.to_frame()
    rules = {"dsi", "olmo_zscore", "zclip", "kill_spike"}
    learned = {"attn_logit", "attn_entropy", "config_only"}
    assert set(frame["scorer"]) == {"model"} | rules | learned
    points = frame.groupby("scorer")["operating_point"].agg(set)
    assert points["model"] == {"budget", "level:watch", "level:warn", "level:critical"}
    assert all(points[s] == {"budget", "native"} for s in rules | learned)
    fitted = (
        frame.set_index(["scorer", "operating_point"])["fitted_on"].groupby(level=[0, 1]).first()
    )
    assert fitted["model", "level:warn"] == "validation" and fitted["dsi", "native"] == "rule"
    assert fitted["attn_logit", "native"] == "validation" and fitted["zclip", "budget"] == "test"
    assert set(frame["source"]) == {"all", "synthetic"}
    # the headline: the model at its stored warn level, the threshold it ships with
    head = report.result("model")
    assert head.operating_point == "level:warn" and head.threshold == model.thresholds["warn"]
    assert report.result("dsi").operating_point == "native"
    # at its ROC-like budget threshold a scorer stays within budget, unless +inf scores (a
    # measured blow-up) alarm at any threshold
    budget_rows = frame[(frame.operating_point == "budget") & (frame.source == "all")]
    within = budget_rows["fa_per_10k"] <= report.budget_per_10k
    assert (within | np.isinf(budget_rows["threshold"])).all()
    assert within[budget_rows.scorer == "model"].all()
    assert {c.level for c in report.budget_checks} == {"watch", "warn", "critical"}
    json.dumps(report.to_dict())  # serialisable as is
    metrics = report.to_metrics()
    assert metrics["model/all/level_warn/recall"] == head.events.recall
    assert all(math.isfinite(v) for v in metrics.values())
    assert (
        report.result("model", operating_point="budget").events.n_runs
        == report.result("dsi", operating_point="budget").events.n_runs
        == len(model.meta["split"]["test"])
    )


def _record(n, onset=None, extra=None, run_id="r", source="real", config=None, **columns):
    frame = pd.DataFrame({"step": np.arange(n), **columns})
    meta = RunMeta(
        run_id=run_id, source=source, onset_step=onset, extra=extra or {}, config=config or {}
    )
    return RunRecord(frame, meta)


def _alarm_at(n, first_alarm, onset, level=0.9):
    s = np.zeros(n)
    if first_alarm is not None:
        s[first_alarm:onset] = level
    return s


class _Levels:
    """A stand-in RiskModel: stored levels and budgets, scores given."""

    def __init__(self) -> None:
        self.horizon = 200
        self.thresholds = {"watch": 0.3, "warn": 0.6, "critical": 0.95}
        self.budgets = {"watch": 1_000, "warn": 10_000, "critical": 100_000}


def test_headline_is_the_stored_level_and_budget_rows_are_fitted_per_source():
    # two sources: real collapses are caught at 0.9 from 150 steps ahead; synthetic healthy
    # runs carry a false alarm at 0.7 (over warn) and one at 0.4 (over watch only)
    n, onset = 1_000, 800
    runs, scores = [], []
    for i in range(4):
        runs.append(_record(n, onset, {"collapse_kind": "loss_rise"}, f"c{i}", loss=_wiggle(n)))
        scores.append(_alarm_at(n, onset - 150, onset))
    for i in range(4):
        runs.append(_record(n, run_id=f"h{i}", source="synthetic", loss=_wiggle(n)))
        s = np.zeros(n)
        s[100:105], s[500:510] = 0.7, 0.4
        scores.append(s)
    report = evaluate_runs(runs, _Levels(), model_scores=scores)
    warn = report.result("model", "all")
    assert (warn.operating_point, warn.fitted_on, warn.threshold) == (
        "level:warn",
        "validation",
        0.6,
    )
    assert (warn.events.caught, warn.events.median_lead, warn.events.false_alarms) == (4, 150, 4)
    # healthy steps: 4 x 600 before onset - H on the collapsing runs, 4 x 1000 healthy
    assert warn.events.healthy_steps == 6_400
    # budget rows: the synthetic source's own threshold must silence its two episodes
    # (4,000 healthy steps allow 0.4 false alarms at 1/10k): just above 0.7
    synthetic = report.result("model", "synthetic", "budget")
    assert synthetic.fitted_on == "test" and synthetic.threshold == np.nextafter(0.7, 1)
    real = report.result("model", "real", "budget")
    # real healthy steps all score 0: its threshold sits just above 0, and catches all
    assert real.threshold == np.nextafter(0.0, 1) and real.events.recall == 1.0
    checks = {(c.source, c.level): c for c in report.budget_checks}
    # warn: 4 false alarms on 4,000 synthetic healthy steps = 10/10k against a budget of 1
    assert (
        checks["synthetic", "warn"].fa_per_10k == 10.0
        and checks["synthetic", "warn"].holds is False
    )
    # watch: 8 episodes (0.7 and 0.4 both over 0.3) = 20/10k against 10: exactly 2x holds
    assert checks["synthetic", "watch"].false_alarms == 8 and checks["synthetic", "watch"].holds
    # real runs: 2,400 healthy steps, no false alarm, and a budget that allows 0.24: too few
    assert checks["real", "warn"].holds is None
    assert report.budget_frame().shape[0] == 9  # 3 levels x (all, real, synthetic)


def test_group_metrics_split_recall_and_lead_by_kind_and_cause():
    runs = [
        _kinded([(900, 1_000)], "loss_rise", "entropy_collapse"),  # caught, lead 100
        _kinded([(950, 1_000)], "loss_rise", "fault_lr_jump"),  # caught, lead 50
        _kinded([], "loss_rise", "entropy_collapse"),  # missed
        _kinded([(980, 1_000)], "nonfinite", "divergence"),  # caught, lead 20
        _kinded([(995, 1_000)], "nonfinite", "divergence"),  # too late: missed
        _kinded([(900, 1_000)], None, None),  # a collapse whose metadata names no kind
        _run(np.r_[np.zeros(100), np.ones(5), np.zeros(900)]),  # healthy: not counted
    ]
    by_kind = {g.group: g.events for g in group_metrics(runs, 0.5, by="kind")}
    assert list(by_kind) == ["loss_rise", "nonfinite", UNKNOWN]
    loss_rise = by_kind["loss_rise"]
    assert (loss_rise.n_collapsed, loss_rise.caught) == (3, 2)
    assert math.isclose(loss_rise.recall, 2 / 3) and loss_rise.median_lead == 75
    nonfinite = by_kind["nonfinite"]
    assert (nonfinite.caught, nonfinite.recall, nonfinite.median_lead) == (1, 0.5, 20)
    assert by_kind[UNKNOWN].recall == 1.0
    by_cause = {g.group: g.events for g in group_metrics(runs, 0.5, by="cause")}
    assert {k: (e.n_collapsed, e.caught) for k, e in by_cause.items()} == {
        "divergence": (2, 1),
        "entropy_collapse": (2, 1),
        "fault_lr_jump": (1, 1),
        UNKNOWN: (1, 1),
    }
    # the kinds add up to the whole
    whole = event_metrics(runs, 0.5)
    assert sum(e.caught for e in by_kind.values()) == whole.caught
    assert sum(e.n_collapsed for e in by_kind.values()) == whole.n_collapsed


def _kinded(alarm_steps, kind, cause, onset=1_000, run_id="c", onset_kind=None):
    run = _collapsing(alarm_steps, onset=onset)
    groups = {"kind": kind, "cause": cause, "onset": onset_kind}
    return ScoredRun(run_id, "real", run.steps, run.scores, onset, groups)


def _kind_report():
    """Three collapses (leads 100, missed, 50) and three healthy runs, scored as "model"."""
    n = 1_000
    records, scores = [], []
    cases = [
        ("loss_rise", "entropy_collapse", "develops", "gpt", 700),  # lead 100
        ("loss_rise", "fault_lr_jump", "sudden", "mha", None),  # missed
        ("grad_collapse", "grad_collapse", None, None, 750),  # lead 50; a family-less real run
    ]
    for i, (kind, cause, onset_kind, family, first_alarm) in enumerate(cases):
        extra = {"collapse_kind": kind, "collapse_cause": cause}
        if onset_kind:
            extra["onset_kind"] = onset_kind
        config = {"family": family} if family else {}
        records.append(_record(n, 800, extra, f"c{i}", config=config, loss=_wiggle(n)))
        scores.append(_alarm_at(n, first_alarm, 800))
    for i in range(3):
        records.append(_record(n, run_id=f"h{i}", config={"family": "mha"}, loss=_wiggle(n)))
        scores.append(np.zeros(n))
    return records, evaluate_runs(records, model_scores=scores)


def test_report_by_group_at_the_same_thresholds():
    _, report = _kind_report()
    kinds = report.group_table("kind")
    assert list(kinds.index) == ["grad_collapse", "loss_rise"]
    assert kinds.loc["loss_rise", "n"] == 2 and kinds.loc["loss_rise", "model recall"] == 0.5
    assert kinds.loc["loss_rise", "model lead"] == 100
    assert kinds.loc["grad_collapse", "model lead"] == 50
    causes = report.group_table("cause", source="real")
    assert causes["model recall"].to_dict() == {
        "entropy_collapse": 1.0,
        "fault_lr_jump": 0.0,
        "grad_collapse": 1.0,
    }
    # sudden collapses apart from those that develop; a run that does not say is unknown
    onset = report.group_table("onset")["model recall"].to_dict()
    assert onset == {"develops": 1.0, "sudden": 0.0, UNKNOWN: 1.0}
    # model families: a real run without one is gpt; healthy runs count in their family
    family = report.group_table("family")
    assert family["n"].to_dict() == {"gpt": 2, "mha": 4}
    assert family["model recall"].to_dict() == {"gpt": 1.0, "mha": 0.0}
    frame = report.groups_frame()
    budget = report.result("model", operating_point="budget").threshold
    assert (frame.loc[frame.operating_point == "budget", "threshold"] == budget).all()
    assert json.loads(json.dumps(report.to_dict()))["groups"]
    metrics = report.to_metrics()
    assert metrics["model/all/budget/kind/loss_rise/recall"] == 0.5
    assert metrics["model/all/budget/cause/fault_lr_jump/n_collapsed"] == 1


def test_feature_gain_table_lists_the_top_features(trained):
    from importance import feature_gain_table

    model, _ = trained
    table = feature_gain_table(model, k=5)
    gain = model.booster.feature_importance("gain")
    assert len(table) == 5 and table["gain"].iloc[0] == gain.max()
    assert table["gain"].is_monotonic_decreasing
    assert math.isclose(table["share"].iloc[0], gain.max() / gain.sum())
    assert (table["signal"] == table["feature"].str.split("__").str[0]).all()


# --------------------------------------------------------------------------- family lead


def _wiggle(n, level=1.0, amplitude=0.1):
    # deterministic "noise": |deviation| <= 1.5 std of itself, never 4
    return level + amplitude * np.sin(np.arange(n) * 1.3)


def test_group_lead_is_the_first_departure_from_the_runs_own_range():
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
    leads = group_leads([run], control_rate=None).set_index("signal_group")
    assert set(leads.index) == set(SIGNAL_GROUPS)
    assert leads.loc["gradient", "lead"] == 120
    assert leads.loc["gradient", "first_signal"] == "grad_norm"
    assert leads.loc["gradient", "n_signals"] == 2
    assert leads.loc["attention", "lead"] == 50
    assert leads.loc["output", "lead"] == 5
    assert leads.loc["update", "n_signals"] == 1 and math.isnan(leads.loc["update", "lead"])
    assert leads.loc["amp", "n_signals"] == 0  # not measured at all
    assert (leads["kind"] == "loss_rise").all() and (leads["cause"] == "entropy_collapse").all()

    table = group_lead_table(group_leads([run], control_rate=None)).set_index("signal_group")
    assert table.loc["gradient", "share"] == 1.0 and table.loc["gradient", "median_lead"] == 120
    assert table.loc["output", "warned"] == 0  # 5 steps ahead is less than MIN_LEAD
    assert table.loc["update", "share"] == 0.0 and table.loc["amp", "n"] == 0


def test_setup_lead_table_reads_each_optimizers_collapses_against_its_own_healthy_runs():
    n, onset = 700, 600
    jump = _wiggle(n)
    jump[n - 80 :] = 5.0  # a healthy run whose gradient departs in its last 200 steps
    runs = []
    for opt in ("adamw", "lion"):
        for i in range(2):  # collapses that develop: the gradient departs 80 steps ahead
            grad = _wiggle(n)
            grad[onset - 80 :] = 5.0
            extra = {"onset_kind": "develops", "collapse_kind": "loss_rise"}
            config = {"optimizer": opt, "family": "gpt"}
            runs.append(_record(n, onset, extra, f"{opt}-c{i}", config=config, grad_norm=grad))
        for i in range(3):  # adamw's healthy runs depart as often; lion's never do
            grad = jump if opt == "adamw" else _wiggle(n)
            config = {"optimizer": opt, "family": "gpt"}
            runs.append(_record(n, run_id=f"{opt}-h{i}", config=config, grad_norm=grad))
    grad = _wiggle(n)
    grad[onset - 80 :] = 5.0  # a sudden collapse: left out of the "develops" rows
    extra = {"onset_kind": "sudden"}
    config = {"optimizer": "lion", "family": "gpt"}
    runs.append(_record(n, onset, extra, "lion-s", config=config, grad_norm=grad))

    leads = group_leads(runs, control_rate=None)
    assert set(leads.loc[leads["run_id"] == "lion-s", "onset"]) == {"sudden"}
    assert set(leads["optimizer"]) == {"adamw", "lion"} and set(leads["model_family"]) == {"gpt"}
    table = setup_lead_table(leads, by="optimizer")
    assert list(table.index) == [("adamw", False), ("adamw", True), ("lion", False), ("lion", True)]
    assert table["runs"].tolist() == [2, 3, 2, 3]
    assert table["gradient"].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert table["attention"].isna().all()  # no run measured it
    with_sudden = setup_lead_table(leads, by="optimizer", onset=None)
    assert with_sudden.loc[("lion", False), "runs"] == 3
    with pytest.raises(ValueError, match="by must be one of"):
        setup_lead_table(leads, by="family")
    rows = _benchmark().setup_group_rows(leads, "optimizer")  # families none measured: out
    assert rows[1] == {"optimizer": "adamw", "runs": "healthy", "n": 3, "gradient": "1.00"}
    assert rows[3] == {"optimizer": "lion", "runs": "healthy", "n": 3, "gradient": "0.00"}


def test_group_lead_discounts_signals_that_drift_on_healthy_runs():
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
    naive = group_leads([collapse, *healthy], control_rate=None)
    calibrated = group_leads([collapse, *healthy])
    for leads, update_departs in ((naive, True), (calibrated, False)):
        row = leads[(leads.run_id == "c")].set_index("signal_group")
        assert (not math.isnan(row.loc["update", "lead"])) == update_departs
        assert row.loc["gradient", "lead"] == 80
    assert calibrated.attrs["n_std"]["param_norm"] > 4.0
    assert calibrated.attrs["n_std"]["grad_norm"] == 4.0
    table = group_lead_table(calibrated).set_index(["kind", "signal_group"])
    # healthy controls come last, one per healthy run, at most 5% departing per signal
    assert group_lead_table(calibrated)["kind"].iloc[-1] == HEALTHY_CONTROL
    assert table.loc[(HEALTHY_CONTROL, "update"), "n"] == 12
    assert table.loc[(HEALTHY_CONTROL, "update"), "share"] <= 0.05 + 1e-9
    assert table.loc[("grad_collapse", "gradient"), "share"] == 1.0


def test_benchmark_tables_from_a_report():
    """benchmarks/predictor_eval.py's per-kind and family tables."""
    bench = _benchmark()

    records, report = _kind_report()
    rows = {r["kind"]: r for r in bench.kind_rows(report, "kind")}
    assert rows["loss_rise"] == {"kind": "loss_rise", "n": 2, "model": "0.50 (100)"}
    assert rows["grad_collapse"]["model"] == "1.00 (50)"
    leads = group_leads(records)  # a steady loss: nothing departs
    fam = {r["cause"]: r for r in bench.group_rows(report, leads, by="cause")}
    assert list(fam)[-1] == HEALTHY_CONTROL and fam[HEALTHY_CONTROL]["model"] == "—"
    assert fam["fault_lr_jump"]["model"] == "0.00" and fam["fault_lr_jump"]["output"] == "0.00"
    assert fam[HEALTHY_CONTROL]["n"] == 3
    md = bench.markdown_table("t", bench.kind_rows(report, "cause"))
    assert md.splitlines()[2] == "| cause | n | model |"
    (line,) = bench.missed_lines(report, leads, by="kind")
    assert line.startswith("kind loss_rise: model catches 50% of 2")
    onset = {r["onset"]: r["model"] for r in bench.kind_rows(report, "onset")}
    assert onset == {"develops": "1.00 (100)", "sudden": "0.00", UNKNOWN: "1.00 (50)"}


def test_benchmark_headline_rows_at_the_stored_level():
    bench = _benchmark()
    n, onset = 1_000, 800
    runs = [
        _record(n, onset, {"collapse_kind": "loss_rise"}, f"c{i}", loss=_wiggle(n))
        for i in range(4)
    ]
    runs += [_record(n, run_id=f"h{i}", loss=_wiggle(n)) for i in range(4)]
    scores = [_alarm_at(n, onset - 150 if i < 2 else None, onset) for i in range(4)]
    scores += [np.zeros(n)] * 4
    scores[4] = np.r_[np.zeros(300), np.full(10, 0.7), np.zeros(690)]  # one warn false alarm
    report = evaluate_runs(runs, _Levels(), model_scores=scores)
    row, real = bench.target_rows(report)
    assert real["source"] == "real" and real["runs"] == 8
    assert (row["source"], row["caught"], row["lead"]) == ("all", "2/4", 150.0)
    # 1 false alarm in 4 x 600 + 4 x 1,000 healthy steps
    assert row["FA/10k"] == pytest.approx(1e4 / 6_400)
    assert row["best baseline (own point) @FA"] == "—"  # no baseline scored
    checks = {(r["source"], r["level"]): r["within 2x"] for r in bench.budget_rows(report)}
    assert checks["all", "warn"] == "yes" and checks["all", "critical"] == "too few steps"


def _benchmark():
    """benchmarks/predictor_eval.py as a module (the script is no package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[3] / "benchmarks" / "predictor_eval.py"
    spec = importlib.util.spec_from_file_location("predictor_eval", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_permuted_targets_shuffle_outcomes_among_a_setups_runs_keeping_them_late():
    # group "x": run a collapses (its last 2 of 4 rows positive), b and c are healthy;
    # group "y": run d collapses with 3 positives, e is healthy with 2 rows only
    runs = np.array(list("aaaabbbccccc") + list("dddee"))
    steps = np.r_[0:4, 0:3, 0:5, 0:3, 0:2] * 10
    y = np.r_[0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0]
    group = np.where(np.isin(runs, list("abc")), "x", "y")
    seen = set()
    for seed in range(40):
        z = permuted_targets(y, runs, steps, group, seed=seed)
        per_run = {r: z[runs == r].tolist() for r in "abcde"}
        # one run of each group holds the positives, as its last rows (all of e's 2)
        assert z[group == "x"].sum() == 2
        holder = next(r for r in "abc" if any(per_run[r]))
        assert per_run[holder][-2:] == [1, 1] and sum(per_run[holder]) == 2
        assert per_run["d"] in ([1, 1, 1], [0, 0, 0]) and per_run["e"] in ([1, 1], [0, 0])
        seen.add(holder)
    assert seen == {"a", "b", "c"}  # over seeds every run of x is drawn to collapse
    again = [permuted_targets(y, runs, steps, group, seed=3) for _ in range(2)]
    assert (again[0] == again[1]).all()  # seeded


def test_separability_is_the_best_single_feature_per_signal_family_and_group():
    rng = np.random.default_rng(0)
    n = 400
    y = np.r_[np.zeros(n // 2), np.ones(n // 2)].astype(int)
    group = np.where(np.arange(n) % 2 == 0, "adamw", "lion")
    informative = y + 0.1 * rng.standard_normal(n)
    grad = np.where(group == "lion", -informative, rng.standard_normal(n))  # lion: reversed
    sparse = np.full(n, np.nan)
    sparse[:50] = 1.0  # too few finite rows in any group: not scored
    X = pd.DataFrame(
        {
            "grad_norm__last_rel": grad,
            "grad_cv__last": rng.standard_normal(n),
            "attn_logit_max__max_rel": sparse,
            "ctx__steps": informative,
        }
    )
    table = separability(X, y, group).set_index(["group", "signal_group"])
    assert list(table.index) == [
        ("adamw", "context"),
        ("adamw", "gradient"),
        ("lion", "context"),
        ("lion", "gradient"),
    ]
    assert table.loc[("lion", "gradient"), "auc"] > 0.99  # read in the direction that works
    assert table.loc[("lion", "gradient"), "feature"] == "grad_norm__last_rel"
    assert 0.5 <= table.loc[("adamw", "gradient"), "auc"] < 0.65  # noise: near 0.5
    assert table.loc[("adamw", "context"), "auc"] > 0.99
    assert table.loc[("adamw", "gradient"), "rows"] == n // 2
    assert table.loc[("adamw", "gradient"), "positives"] == n // 4
    with pytest.raises(ValueError, match="one entry per row"):
        separability(X, y[:-1], group)
    rows = _benchmark().separability_rows(separability(X, y, group), "optimizer")
    assert [r["signals"] for r in rows] == ["context", "gradient", "rows (pre-collapse)"]
    assert rows[1]["lion"] == "1.00" and rows[2] == {
        "signals": "rows (pre-collapse)",
        "adamw": "200 (100)",
        "lion": "200 (100)",
    }
    # the noise floor in brackets: the same table on targets shuffled among the rows
    # (here each row its own "run"), where no feature informs
    shuffled = permuted_targets(y, np.arange(n), np.zeros(n), group, seed=0)
    null = separability(X, shuffled, group)
    rows = _benchmark().separability_rows(separability(X, y, group), "optimizer", null)
    lion, floor = rows[1]["lion"].split(" ")
    assert lion == "1.00" and 0.5 <= float(floor.strip("()")) < 0.6
