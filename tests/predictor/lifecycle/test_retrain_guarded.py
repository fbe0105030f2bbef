"""The user's loop on a model written here: record healthy runs, calibrate, serve the
calibrated model, guard runs through the service, kill the server (the guard scores with
the served model, named as its fallback, under the same version), guard ramp runs, retrain
on the guarded runs (rescues labelled, the rows the guard left known kept), promote on the
set-up's held-out runs, and serve the new champion, whose levels are the user's set-up's.

The model is a looped (weight-shared) GPT: one block applied ``depth`` times, a learned
embedding per pass, RMS norms without gain. The data generator draws none like it (its
families stack distinct blocks), so the bundled model never saw its set-up.
"""

from __future__ import annotations

import os
import warnings

import httpx
import pytest
import torch
import torch.nn.functional as F
from guarded_retrain import collapsing, seeded, steady, train_run
from predictor_settings import LIFECYCLE_TRAINING
from support import serve_process, wait_ready
from torch import nn

from collapse_guard.guard import ServiceRisk
from collapse_guard.predictor.core.recalibrate import calibrate
from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.core.seen_runs import SeenRuns
from collapse_guard.predictor.lifecycle import registry
from collapse_guard.predictor.lifecycle.retrain import retrain
from collapse_guard.runfiles import read_meta, read_run

STEPS = 520


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class LoopedGPT(nn.Module):
    """One attention + MLP block applied ``depth`` times; ``forward(x, y) -> (logits, loss)``."""

    def __init__(self, vocab: int = 128, seq: int = 32, width: int = 48, depth: int = 2) -> None:
        super().__init__()
        self.heads = 4
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.passes = nn.Parameter(torch.zeros(depth, width))  # which pass the block is in
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )
        self.head = nn.Linear(width, vocab, bias=False)

    def _attend(self, h: torch.Tensor) -> torch.Tensor:
        b, t, c = h.shape
        q, k, v = self.c_attn(_rms(h)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):
        h = self.wte(x) + self.wpe(torch.arange(x.size(1)))
        for extra in self.passes:
            h = h + extra
            h = h + self._attend(h)
            h = h + self.mlp(_rms(h))
        logits = self.head(_rms(h))
        loss = None if y is None else F.cross_entropy(logits.flatten(0, 1), y.flatten())
        return logits, loss


def runs(kind: str, seeds, out, risk=None):
    schedule = {"healthy": steady(), "ramp": collapsing()}[kind]
    return [
        train_run(seeded(LoopedGPT, s), schedule, STEPS, out, f"{kind}-{s}", seed=s, risk=risk)
        for s in seeds
    ]


@pytest.mark.slow  # ~2-4 min: 11 runs of a torch model and a retrain
def test_guarded_runs_teach_retrain_and_promote_levels_of_the_users_set_up(store, base, tmp_path):
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # the guard's one-line notices
    recorded = runs("healthy", range(3), tmp_path / "recorded")
    v1 = registry.log_calibration(calibrate(RiskModel.load(), recorded))
    assert registry.champion_version() == v1.version == "1"
    champion = RiskModel.load(f"models:/{registry.MODEL_NAME}@{registry.CHAMPION}")
    folder = champion.save(tmp_path / "v1")
    guarded = tmp_path / "guarded"
    # served, then the server killed: the guard goes on with the served model (named with
    # it) under the same version, never silently with the bundled one
    env = dict(os.environ, BENTOML_HOME=str(tmp_path / "bentoml"))
    with serve_process(tmp_path, ["--workers", "1", "--model", str(folder)], env) as served:
        url, proc, log = served
        wait_ready(url, proc, log)
        version = httpx.get(f"{url}/model").json()["version"]
        risk = ServiceRisk(url, fallback=str(folder))
        (through_service,) = runs("healthy", [10], guarded, risk=risk)
    (after_kill,) = runs("healthy", [11], guarded, risk=ServiceRisk(url, fallback=str(folder)))
    summaries = [read_meta(p).extra["guard"] for p in (through_service, after_kill)]
    assert [g["risk_source"] for g in summaries] == ["service", "fallback"]
    assert [g["risk_model_version"] for g in summaries] == [version, version]
    runs("ramp", range(20, 26), guarded, risk=str(folder))

    result = retrain([str(guarded)], base=base, **LIFECYCLE_TRAINING)

    by_id = {i.run_id: i for i in result.ingest.ingested}
    ramps = [f"ramp-{s}" for s in range(20, 26)]
    assert sorted(by_id) == ["healthy-10", "healthy-11", *ramps]
    assert result.ingest.rejected == []
    for run_id in ramps:
        censoring = by_id[run_id].censoring
        frame, meta = read_run(by_id[run_id].path)
        # a rescue is a caught collapse: its rows up to the rescue, labelled collapsing (the
        # onset where the excursion it caught began, or the rescue's own step)
        assert censoring.rescue is not None and frame["step"].max() == censoring.rescue
        assert meta.onset_step is not None and meta.onset_step <= censoring.rescue
        assert len(frame) == censoring.rows_kept > 250
    for run_id in ("healthy-10", "healthy-11"):
        censoring = by_id[run_id].censoring
        _, meta = read_run(by_id[run_id].path)
        # skips of one batch and QK-clips leave the outcome known: every row kept
        assert meta.onset_step is None and censoring.rows_kept == censoring.rows_before == STEPS
    # the set-up's runs dealt: 1 healthy and 3 rescued held out, 1 healthy calibrates
    setup = result.setup
    assert len(setup.held_out) == 4 and len(setup.calibration) == 1
    trained_new = set(by_id) - setup.apart
    assert len(trained_new) == 3 and trained_new <= set(ramps)
    # the challenger trained on the base runs less the benchmark, and the 3 rescued runs
    assert result.training_runs == 60 - len(result.benchmark.run_ids) + 3
    challenger = RiskModel.load(f"models:/{registry.MODEL_NAME}/{result.version}")
    seen = SeenRuns.from_meta(challenger.meta)
    # the training's own split (stratified by source) puts 2 of the 3 in train or validation
    # and keeps 1 to test on
    assert len(trained_new & (set(seen.train) | set(seen.validation))) == 2
    # judged where it will serve: levels and recall on the held-out runs of the set-up,
    # the benchmark for ranking only; both named by their registered versions
    assert set(result.comparison_run_ids) == set(setup.held_out)
    assert "compare.challenger.ranking_roc_auc" in result.metrics
    assert "challenger v2: " in result.reason and "champion v1: " in result.reason
    assert result.promoted and registry.champion_version() == "2", result.reason
    # the new champion's levels come from the user's set-up
    new_champion = RiskModel.load(f"models:/{registry.MODEL_NAME}@{registry.CHAMPION}")
    assert list(new_champion.meta["calibrated_on"]) == list(setup.calibration)
    assert new_champion.meta["levels_from"]["by"] == "calibrate"
    # and it serves: the registry's champion alias, read by the service
    env = dict(os.environ, BENTOML_HOME=str(tmp_path / "bentoml-2"))
    source = f"models:/{registry.MODEL_NAME}@{registry.CHAMPION}"
    (tmp_path / "serve-2").mkdir()
    with serve_process(tmp_path / "serve-2", ["--workers", "1", "--model", source], env) as served:
        url, proc, log = served
        wait_ready(url, proc, log)
        info = httpx.get(f"{url}/model").json()
    assert info["thresholds"] == pytest.approx(new_champion.thresholds)
    assert info["version"] != version  # v2 serves now, not the model the guard fell back on


@pytest.mark.parametrize(
    ("kind", "n", "benchmark_chosen"), [("any", 2, False), ("any", 4, True), ("healthy", 6, True)]
)
def test_a_failed_retrain_leaves_no_file_and_no_benchmark_behind(
    store, tmp_path, base_paths, kind, n, benchmark_chosen
):
    # 2 runs: too few to set a benchmark apart; 4, or 6 healthy ones: a benchmark of one run
    # is recorded, then the training finds too few runs (no collapse) to learn from
    from typer.testing import CliRunner

    from collapse_guard.cli import app
    from collapse_guard.predictor.lifecycle.benchmark import find_benchmark
    from collapse_guard.runfiles import read_meta

    healthy = [p for p in base_paths if read_meta(p).onset_step is None]
    chosen = (healthy if kind == "healthy" else base_paths)[:n]
    base = tmp_path / "runs"  # the default --base, with nothing in it yet
    folder = tmp_path / "new"
    folder.mkdir()
    for path in chosen:
        (folder / path.name).write_bytes(path.read_bytes())
    args = ["retrain", "--runs", str(folder), "--base", str(base), "--tracking-uri", store]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "too few runs to train" in result.output, result.output
    assert "Traceback" not in result.output
    assert ("chosen now" in result.output) is benchmark_chosen
    assert not (base / "ingested").exists()  # the copies taken back
    assert find_benchmark(registry.ensure_experiment()) is None  # and the benchmark record
