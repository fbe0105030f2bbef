"""The bundled default model: rebuilt by one command, small, loadable, replaced only when done.

``train_risk_model`` is replaced by the session's cached training (the pipeline has its
own tests); these tests check what the bundle adds: runs, size limit, folder, printout.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from ops_fixtures import N_RUNS, SEED, synthetic_run_paths, training

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.cli import bundle as bundle_cli
from collapse_guard.predictor.core.risk import DEFAULT_MODEL_DIR, RiskModel
from collapse_guard.predictor.lifecycle import bundle


@pytest.fixture
def cached_training(tmp_path_factory, monkeypatch):
    import collapse_guard.predictor.training.train as train_module

    result = training(tmp_path_factory.getbasetemp())
    calls = []

    def fake(paths, config, **kwargs):
        calls.append(list(paths))
        assert config.seed == SEED  # the bundle's seed trains the model too
        # a collapse's positives: its rows near the onset, unlike train's default of every row
        assert config.positives_within == bundle.BUNDLE_POSITIVES_WITHIN == 100
        return result

    monkeypatch.setattr(train_module, "train_risk_model", fake)
    return calls


@pytest.fixture
def work(tmp_path_factory):
    # the session's synthetic runs, made with the same seed: the bundle reuses the files
    return synthetic_run_paths(tmp_path_factory.getbasetemp())[0].parent


def test_bundle_writes_a_small_loadable_model(
    tmp_path, tmp_path_factory, work, cached_training, capsys
):
    out = tmp_path / "default_model"
    argv = ["--synthetic", str(N_RUNS), "--seed", str(SEED), "--work", str(work)]
    bundle_cli.main([*argv, "--out", str(out), "--real", str(work)])
    assert len(cached_training[0]) == 2 * N_RUNS  # synthetic + the "real" folder
    assert 0 < bundle.folder_bytes(out) < bundle.MAX_BYTES
    model = RiskModel.load(out)
    # named by the training's one data fingerprint
    fingerprint = training(tmp_path_factory.getbasetemp()).fingerprint
    assert model.meta["version"] == f"default-{fingerprint}-{model.fingerprint()[:8]}"
    bundled = model.meta["bundle"]
    assert bundled == {"synthetic": N_RUNS, "real": N_RUNS, "seed": SEED, **bundled}
    # what the next rebuild is compared with: every run read, and its collapses
    assert bundled["runs"] == 2 * N_RUNS and 0 < bundled["collapsed"] < 2 * N_RUNS
    printed = capsys.readouterr().out
    assert "default model" in printed and "dsi" in printed


def test_an_oversized_model_is_refused_and_the_old_one_kept(
    tmp_path, work, cached_training, monkeypatch
):
    out = tmp_path / "default_model"
    out.mkdir()
    (out / "keep.txt").write_text("previous model")
    monkeypatch.setattr(bundle, "MAX_BYTES", 1000)
    with pytest.raises(ValueError, match="fewer trees"):
        bundle.build_default_model(out, synthetic=N_RUNS, work=work, seed=SEED)
    assert (out / "keep.txt").read_text() == "previous model"


def test_the_shipped_model_loads_and_is_small():
    model = RiskModel.load()
    assert bundle.folder_bytes(DEFAULT_MODEL_DIR) < bundle.MAX_BYTES
    assert set(model.thresholds) == {"watch", "warn", "critical"}
    # real runs only (the corpus pack), of four families, with levels that hold on a family
    # it never saw
    assert model.meta["bundle"]["real"] >= 600 and model.meta["bundle"]["synthetic"] == 0
    assert model.meta["train_config"]["positives_within"] == 100
    assert model.budgets["warn"] == 5_000  # 2 false alarms per 10k healthy steps
    assert model.meta["levels_from"] == {
        "runs": "cross-fitted",
        "by": "family",
        "groups": ["drawn", "gpt", "mha", "rope_swiglu"],
    }


def test_a_bundle_without_runs_is_one_line_and_exit_code_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()  # without --real it trains on the corpus pack, corpus/real
    with pytest.raises(SystemExit) as stopped:
        bundle_cli.main(["--real", str(tmp_path / "empty"), "--out", str(tmp_path / "model")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"no runs found under {tmp_path / 'empty'}" in err
    assert not (tmp_path / "model").exists()


def test_the_bundle_stores_the_runs_it_saw_and_stays_small_with_thousands(
    tmp_path, work, cached_training
):
    from collapse_guard.predictor.core.seen_runs import SeenRuns

    out = tmp_path / "default_model"
    bundle.build_default_model(out, synthetic=N_RUNS, work=work, seed=SEED, progress=str)
    model = RiskModel.load(out)
    seen = SeenRuns.from_meta(model.meta)
    assert len(seen.train) == len(model.meta["split"]["train"]) > 0
    # 3,000 training and 1,000 validation ids of 30 characters: ~140 KB more
    model.meta["train_run_ids"] = [f"real-family-optimizer-{i:08d}" for i in range(3_000)]
    model.meta["validation_run_ids"] = [f"real-family-optimizer-v{i:07d}" for i in range(1_000)]
    big = model.save(tmp_path / "big")
    assert bundle.folder_bytes(big) - bundle.folder_bytes(out) < 200_000
    assert bundle.folder_bytes(big) < bundle.MAX_BYTES
    assert SeenRuns.from_meta(RiskModel.load(big).meta).role_of("real-family-optimizer-00002999")


def test_a_smaller_data_set_does_not_replace_the_model_unless_forced(
    tmp_path, work, cached_training
):
    # issue 21: `make default-model REAL=data/real` on a folder of 56 runs silently replaced
    # the shipped 526-run model; today's is the 1021-run pack's
    out = tmp_path / "default_model"
    shutil.copytree(DEFAULT_MODEL_DIR, out)
    shipped = RiskModel.load(out).meta["version"]
    with pytest.raises(UserInputError) as refused:
        bundle.build_default_model(out, synthetic=N_RUNS, work=work, seed=SEED)
    message = str(refused.value)
    assert f"({shipped}: 1021 runs, 476 collapsed)" in message
    assert f"trained on {N_RUNS} runs" in message and "FORCE=1" in message
    assert cached_training == []  # refused before any training
    assert RiskModel.load(out).meta["version"] == shipped
    said: list[str] = []
    forced = bundle.build_default_model(
        out, synthetic=N_RUNS, work=work, seed=SEED, force=True, progress=said.append
    )
    new = forced.model.meta
    collapsed = new["bundle"]["collapsed"]
    assert RiskModel.load(out).meta["version"] == new["version"] != shipped
    assert said[-1] == (
        f"replaced {shipped} (1021 runs, 476 collapsed) with {new['version']} "
        f"({N_RUNS} runs, {collapsed} collapsed) [forced]"
    )
    # the same data set again is no poorer: replaced without being forced
    bundle.build_default_model(out, synthetic=N_RUNS, work=work, seed=SEED, progress=said.append)
    assert said[-1].startswith(f"replaced {new['version']} ({N_RUNS} runs, {collapsed} collapsed)")


def test_the_shipped_model_keeps_the_counts_a_rebuild_is_compared_with():
    version, counts = bundle.bundled_counts(DEFAULT_MODEL_DIR)
    assert version == RiskModel.load().meta["version"]
    # corpus/README.md's card: 1021 runs, 476 collapsed (338 develop, 138 sudden), 545 healthy
    assert counts == {"runs": 1021, "collapsed": 338 + 138}


def test_make_default_model_passes_force_on():
    root = Path(__file__).resolve().parents[3]
    dry = ["make", "-n", "-C", str(root), "default-model", "REAL=somewhere"]
    plain = subprocess.run(dry, capture_output=True, text=True, timeout=60, check=True).stdout
    forced = subprocess.run(
        [*dry, "FORCE=1"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "--real somewhere" in plain and "--force" not in plain
    assert "--real somewhere --force" in forced
