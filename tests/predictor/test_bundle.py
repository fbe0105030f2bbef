"""The bundled default model: rebuilt by one command, small, loadable, replaced only when done.

``train_risk_model`` is replaced by the session's cached training (the pipeline has its
own tests); these tests check what the bundle adds: runs, size limit, folder, printout.
"""

from __future__ import annotations

import pytest
from ops_fixtures import N_RUNS, SEED, synthetic_run_paths, trained

from collapse_guard.predictor import bundle
from collapse_guard.predictor.risk import DEFAULT_MODEL_DIR, RiskModel


@pytest.fixture
def cached_training(tmp_path_factory, monkeypatch):
    import collapse_guard.predictor.train as train_module

    model, report, _ = trained(tmp_path_factory.getbasetemp())
    calls = []

    def fake(paths, **kwargs):
        calls.append(list(paths))
        return model, report

    monkeypatch.setattr(train_module, "train_risk_model", fake)
    return calls


@pytest.fixture
def work(tmp_path_factory):
    # the session's synthetic runs, made with the same seed: the bundle reuses the files
    return synthetic_run_paths(tmp_path_factory.getbasetemp())[0].parent


def test_bundle_writes_a_small_loadable_model(tmp_path, work, cached_training, capsys):
    out = tmp_path / "default_model"
    argv = ["--synthetic", str(N_RUNS), "--seed", str(SEED), "--work", str(work)]
    bundle.main([*argv, "--out", str(out), "--real", str(work)])
    assert len(cached_training[0]) == 2 * N_RUNS  # synthetic + the "real" folder
    assert 0 < bundle.folder_bytes(out) < bundle.MAX_BYTES
    model = RiskModel.load(out)
    assert model.meta["version"].startswith("default-")
    assert model.meta["bundle"] == {"synthetic": N_RUNS, "real": N_RUNS, "seed": SEED}
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
    assert model.meta["bundle"]["synthetic"] > 0
