"""The loop a user lives in, on models nobody here wrote: guard -> run file -> retrain ->
served champion, for a nanoGPT-shaped loop, transformers' Trainer and Lightning
(``real_clients``), each guarded by the bundled model (issue 21, "Real clients as tests")."""

from __future__ import annotations

import math

import mlflow
import pytest
from lifecycle_models import never_warning_champion, served
from predictor_settings import LIFECYCLE_TRAINING
from real_clients import STEPS

from collapse_guard.predictor.core.levels import LEVELS
from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.core.seen_runs import SeenRuns
from collapse_guard.predictor.lifecycle import registry
from collapse_guard.predictor.lifecycle.retrain import STATE_TAG, retrain
from collapse_guard.runfiles import read_run
from collapse_guard.service import RiskClient

pytestmark = pytest.mark.slow  # the three clients train ~45 s once; the retrain test ~60 s
CLIENTS = ("nanogpt", "llama", "lightning")
ATTENTION_EVERY = 10  # the probe's default period for the attention signals


@pytest.mark.parametrize("name", CLIENTS)
def test_each_client_writes_a_guarded_run_file_of_every_step(client_runs, name):
    run = client_runs[name]
    frame, meta = read_run(run.path)
    assert meta.source == "guarded" and meta.extra["guard"]["steps"] == STEPS
    assert frame["step"].tolist() == list(range(STEPS))
    # the LR the loop (nanoGPT: param_group["lr"] itself) or the framework's scheduler set:
    # the guard, which never intervened, left it as it was
    assert run.summary["skipped"] == run.summary["rescues"] == 0
    assert frame["lr"].tolist() == pytest.approx(run.lrs, rel=1e-12, abs=0)
    assert frame["loss"].map(math.isfinite).all()
    assert frame["loss"].tail(20).mean() < frame["loss"].head(20).mean() - 0.1  # it learns
    # attention reached: fused c_attn + SDPA, Llama's SDPA, nn.MultiheadAttention
    assert frame["attn_entropy_mean"].notna().sum() == STEPS // ATTENTION_EVERY
    assert (frame["event"] == "checkpoint").sum() == run.summary["checkpoints"] >= 2


def test_the_trainers_warmup_starts_at_lr_0(client_runs):
    frame, _ = read_run(client_runs["llama"].path)
    assert frame["lr"].iloc[0] == 0.0 and frame["lr"].iloc[1] > 0.0


def test_retrain_ingests_every_client_run_into_the_served_champion(
    tmp_path, store, base, client_runs
):
    never_warning_champion(base)  # v1: catches nothing, so a working challenger beats it
    folders = [str(run.path.parent) for run in client_runs.values()]
    result = retrain(folders, base=base, **LIFECYCLE_TRAINING)  # the Trainer's run starts at lr = 0
    report = result.ingest
    ids = {read_run(run.path)[1].run_id: name for name, run in client_runs.items()}
    assert sorted(report.run_ids) == sorted(ids) and len(report.ingested) == 3
    assert report.rejected == []
    assert all(i.censoring.first_intervention is None for i in report.ingested)  # labelled whole
    assert len(report.ignored) >= 6  # each folder's checkpoints (guard-<step>.pt), not runs
    # the verdict is recorded; seeded, measured: the challenger is promoted over v1
    assert result.version == "2" and result.previous_champion == "1"
    assert result.promoted and result.champion == registry.champion_version() == "2"
    tags = mlflow.MlflowClient().get_run(result.mlflow_run_id).data.tags
    assert tags["promotion"] == "promoted" and tags[STATE_TAG] == "done"
    # the challenger learnt from them: 60 base runs + 3 new - 12 frozen for the benchmark
    assert result.training_runs == 51 and len(result.benchmark.run_ids) == 12
    seen = SeenRuns.from_meta(RiskModel.load("models:/collapse-predictor/2").meta)
    assert set(ids) <= set(seen.train) | set(seen.validation)
    with served(tmp_path, "--model", "models:/collapse-predictor@champion") as url:
        with RiskClient(url, timeout=30.0) as client:
            for run in client_runs.values():
                frame = read_run(run.path)[0].drop(columns="event")
                for window in (frame.iloc[:200], frame.iloc[-200:]):  # from lr = 0, and late
                    answer = client.risk(window)
                    assert answer.model_version == "2" and answer.step == window["step"].max()
                    assert 0.0 <= answer.probability <= 1.0 and answer.level in ("ok", *LEVELS)
                    assert answer.reason is None  # every loss finite: nothing collapsing now
