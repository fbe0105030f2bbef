"""benchmarks/learning_curve.py on synthetic runs relabelled as real runs of two model
families: its rows (nested sizes, the held-out family never trained on, finite numbers),
its resumable output and its tables."""

from __future__ import annotations

import dataclasses
import math

import learning_curve as lc  # benchmarks/ is on the tests' path
import pytest
from predictor_settings import FAST_PARAMS

from collapse_guard.predictor.training.config import TrainConfig
from collapse_guard.runfiles.records import RunRecord

SIZES = (12, lc.ALL)
N_RUNS = 40  # 20 a family: the pool is the other family's 20
PARAMS = {**FAST_PARAMS, "n_estimators": 20}  # the rows are under test, not the accuracy


def _relabel(record: RunRecord, i: int) -> RunRecord:
    """A real run of family gpt or mha (norm fixed by the family, qk_norm not), its
    collapse one that develops."""
    family = ("gpt", "mha")[i % 2]
    config = {"family": family, "norm": {"gpt": "layernorm", "mha": "rmsnorm"}[family]}
    extra = dict(record.meta.extra)
    if record.meta.onset_step is not None:
        extra["onset_kind"] = "develops"
    meta = dataclasses.replace(
        record.meta, source="real", config={**config, "qk_norm": i % 3 == 0}, extra=extra
    )
    return RunRecord(record.frame, meta, record.path)


@pytest.fixture(scope="module")
def curve(run_records, tmp_path_factory):
    runs = [_relabel(r, i) for i, r in enumerate(run_records[:N_RUNS])]
    out = tmp_path_factory.mktemp("curve") / "curve.jsonl"
    config = TrainConfig(stride=50, params=PARAMS)
    rows = lc.learning_curve(runs, out, by=("family",), sizes=SIZES, seeds=(0,), config=config)
    return runs, out, rows


def test_each_family_is_held_out_at_nested_sizes_and_never_trained_on(curve):
    runs, _, rows = curve
    family = {r.run_id: r.meta.config["family"] for r in runs}
    assert [(r["group"], r["size"]) for r in rows] == [
        (f, str(s)) for f in ("gpt", "mha") for s in SIZES
    ]
    for held in ("gpt", "mha"):
        mine = [r for r in rows if r["group"] == held]
        assert all("error" not in r for r in mine), mine
        seen = [set(r["train_ids"]) | set(r["validation_ids"]) for r in mine]
        assert [len(s) for s in seen] == [12, 20]  # the pool: the other family's 20
        assert seen[0] < seen[1]  # nested
        test = {i for i, f in family.items() if f == held}
        for r, ids in zip(mine, seen, strict=True):
            assert set(r["test_ids"]) == test and not ids & test
            assert {family[i] for i in ids} == {"mha" if held == "gpt" else "gpt"}


def test_every_trained_row_has_finite_figures(curve):
    for row in curve[2]:
        assert row["develops"] > 0 and 0 <= row["recall_develops"] <= 1
        for key in ("fa_per_10k", "inside_fa_per_10k", "outside_fa_per_10k", "warn"):
            assert math.isfinite(row[key]) and row[key] >= 0, (key, row)
        assert row["inside_healthy_steps"] > 0  # the synthetic runs' LR rises
        assert 0 <= row["inside_roc_auc"] <= 1 and 0 <= row["outside_roc_auc"] <= 1


def test_rows_already_written_are_not_run_again(curve):
    runs, out, rows = curve
    before = out.read_text()
    again = lc.learning_curve(runs, out, by=("family",), sizes=SIZES, seeds=(0,))
    assert out.read_text() == before and again == rows


def test_the_tables_have_each_size_the_mean_and_a_slope_per_doubling(curve):
    rows = curve[2]
    table = lc.curve_rows(rows, "family")
    assert [(r["family"], r["size"]) for r in table][-2:] == [("mean", str(s)) for s in SIZES]
    mean = [r for r in table if r["family"] == "mean"]
    gpt = [r for r in table if r["family"] == "gpt"]
    mha = [r for r in table if r["family"] == "mha"]
    for m, a, b in zip(mean, gpt, mha, strict=True):
        assert math.isclose(m["FA/10k"], (a["FA/10k"] + b["FA/10k"]) / 2)
    slopes = {r["family"]: r for r in lc.slope_rows(rows, "family")}
    assert set(slopes) == {"gpt", "mha", "mean"}
    for held in ("gpt", "mha"):
        # two sizes, 12 and 20 runs: the slope is the change over log2(20 / 12) doublings
        small, whole = (r["fa_per_10k"] for r in rows if r["group"] == held)
        expected = (whole - small) / math.log2(20 / 12)
        assert math.isclose(slopes[held]["FA/10k"], expected, abs_tol=1e-9)


def test_report_only_prints_the_markdown_tables(curve, capsys):
    assert lc.main(["--out", str(curve[1]), "--report-only"]) == 0
    text = capsys.readouterr().out
    assert "**leave-one-family-out by training runs" in text
    assert "| mean | all |" in text and "change per doubling" in text


def test_a_component_fixed_by_the_family_cannot_be_separated(curve):
    rows = {r["component"]: r for r in lc.confounded_rows([r.meta for r in curve[0]])}
    assert rows["norm"]["separable from family"] == "no"
    assert rows["qk_norm"]["separable from family"] == "yes"
    assert rows["mlp"]["separable from family"] == "—"  # one value (unknown) everywhere


def test_nested_order_keeps_each_strata_share_in_every_prefix(run_records):
    metas = [_relabel(r, i).meta for i, r in enumerate(run_records)]
    order = lc.nested_order(metas, seed=3)
    assert sorted(order) == sorted(m.run_id for m in metas)
    assert order != lc.nested_order(metas, seed=4)
    gpt = {m.run_id for m in metas if m.config["family"] == "gpt"}
    for k in (10, 20, 40):
        assert abs(sum(i in gpt for i in order[:k]) - k / 2) <= 2  # gpt is half the runs
