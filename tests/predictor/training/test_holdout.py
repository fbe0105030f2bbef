"""Leave-one-family-out on synthetic runs relabelled as real runs of two model families."""

from __future__ import annotations

import dataclasses
import math

import pytest
from predictor_settings import FAST_PARAMS

from collapse_guard.predictor.training.holdout import leave_one_group_out
from collapse_guard.runfiles.records import RunRecord


def _as_family(record: RunRecord, family: str | None) -> RunRecord:
    if family is None:
        return record  # stays synthetic: no family, always trained on
    meta = dataclasses.replace(record.meta, source="real", config={"family": family})
    return RunRecord(record.frame, meta, record.path)


@pytest.fixture(scope="module")
def families(run_records):
    names = (None, "gpt", "rope_swiglu")
    return [_as_family(r, names[i % 3]) for i, r in enumerate(run_records)]


@pytest.fixture(scope="module")
def holdout(families):
    return leave_one_group_out(families, by="family", stride=25, params=FAST_PARAMS)


def test_each_family_is_tested_on_a_model_that_never_saw_it(families, holdout):
    by_family = {}
    for r in families:
        by_family.setdefault(r.meta.config.get("family", "synthetic"), set()).add(r.run_id)
    assert [f.group for f in holdout.folds] == ["gpt", "rope_swiglu"]
    for fold in holdout.folds:
        test, seen = set(fold.test_ids), set(fold.train_ids) | set(fold.validation_ids)
        assert test == by_family[fold.group]
        assert not test & seen
        assert by_family["synthetic"] <= seen  # synthetic runs are always trained on
        other = next(f for f in by_family if f not in (fold.group, "synthetic"))
        assert by_family[other] <= seen
        assert fold.report.result("model").operating_point == "level:warn"


def test_the_table_has_each_family_and_the_unweighted_mean(holdout):
    frame = holdout.frame()
    model = frame[frame["scorer"] == "model"].set_index("group")
    assert list(model.index) == ["gpt", "rope_swiglu", "mean"]
    recalls = [f.report.result("model").events.recall for f in holdout.folds]
    assert math.isclose(model.loc["mean", "recall"], sum(recalls) / 2)
    assert model.loc["mean", "caught"] == sum(
        f.report.result("model").events.caught for f in holdout.folds
    )
    assert {"dsi", "olmo_zscore", "attn_logit", "config_only"} <= set(frame["scorer"])
    wide = holdout.wide("recall")
    assert list(wide.index) == ["gpt", "rope_swiglu", "mean"] and wide.columns[0] == "model"


def test_the_roc_like_table_holds_the_model_to_the_budget_on_the_held_out_runs(holdout):
    fa = holdout.wide("fa_per_10k", "budget")
    assert list(fa.index) == ["gpt", "rope_swiglu", "mean"] and fa.columns[0] == "model"
    assert (fa["model"] <= 1.0 + 1e-9).all()  # the evaluation's budget: 1 per 10k
    first = holdout.folds[0].report.result("model", "all", "budget").events
    assert holdout.wide("recall", "budget").loc["gpt", "model"] == first.recall
    assert holdout.frame(operating_point="budget")["operating_point"].eq("budget").all()


def test_without_synthetic_runs_or_with_one_family_only(families):
    real = [r for r in families if r.meta.source == "real"]
    with pytest.raises(ValueError, match="at least two family values"):
        leave_one_group_out([r for r in real if r.meta.config["family"] == "gpt"])
    with pytest.raises(ValueError, match="one of"):
        leave_one_group_out(families, by="colour")


def test_the_cli_table_has_a_row_per_scorer_and_fits_80_columns(holdout):
    from rich.console import Console

    from collapse_guard.predictor.cli.commands import holdout_table

    console = Console(width=80, record=True)
    console.print(holdout_table(holdout, "leave-one-family-out"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    model = next(line for line in text.splitlines() if line.strip().startswith("model"))
    gpt = holdout.folds[0].report.result("model").events
    assert f"{gpt.recall:.2f}" in model and "@" in model
    assert "gpt" in text and "rope_swiglu" in text and "mean" in text


def test_group_counts_say_what_the_model_caught_per_cause_on_each_held_out_family(holdout):
    from rich.console import Console

    from collapse_guard.predictor.cli.tables import holdout_groups_table

    counts = holdout.group_counts("cause")
    assert list(dict.fromkeys(counts.columns.get_level_values(0))) == ["gpt", "rope_swiglu", "all"]
    for fold in holdout.folds:
        model = fold.report.result("model").events
        # the causes of a held-out family add up to its collapses and what was caught
        assert counts[(fold.group, "n")].sum() == model.n_collapsed > 0
        assert counts[(fold.group, "caught")].sum() == model.caught
    assert (counts[("all", "n")] == counts[("gpt", "n")] + counts[("rope_swiglu", "n")]).all()
    console = Console(width=100, record=True)
    console.print(holdout_groups_table(holdout, "cause", "per cause"))
    text = console.export_text()
    cause, row = next(iter(counts.iterrows()))
    caught, n = row[("all", "caught")], row[("all", "n")]
    line = next(x for x in text.splitlines() if x.strip().startswith(str(cause)))
    assert f"({caught}/{n})" in line and "@" not in line


def test_group_counts_per_set_up_say_where_the_false_alarms_went(holdout):
    from rich.console import Console

    from collapse_guard.predictor.cli.tables import holdout_groups_table

    counts = holdout.group_counts("optimizer")
    for fold in holdout.folds:
        model = fold.report.result("model").events
        # every run has one optimizer: its runs' false alarms and healthy steps add up
        assert counts[(fold.group, "false_alarms")].sum() == model.false_alarms
        assert counts[(fold.group, "healthy_steps")].sum() == model.healthy_steps > 0
    console = Console(width=120, record=True)
    console.print(holdout_groups_table(holdout, "optimizer", "per optimizer"))
    text = console.export_text()
    optimizer, row = next(iter(counts.iterrows()))
    rate = 1e4 * row[("all", "false_alarms")] / row[("all", "healthy_steps")]
    line = next(x for x in text.splitlines() if x.strip().startswith(str(optimizer)))
    assert line.rstrip().endswith(f"@{rate:.2g}" if rate < 10 else f"@{rate:.0f}")
