"""Fleet training: features on Dask workers, lightgbm.dask fit, same pipeline afterwards."""

from __future__ import annotations

import numpy as np
import pytest
from ops_fixtures import synthetic_run_paths, trained

from collapse_guard.features import FeatureExtractor
from collapse_guard.predictor import fleet


def test_chunk_rows_are_training_rows_with_their_target(tmp_path_factory):
    from collapse_guard.predictor.training_data import build_training_data, load_runs

    paths = [str(p) for p in synthetic_run_paths(tmp_path_factory.getbasetemp())[:3]]
    extractor = FeatureExtractor(window=200, signals=("loss", "grad_norm", "attn_kl"))
    names = list(extractor.schema.names)
    rows = fleet.chunk_rows(
        paths, window=200, signals=extractor.signals, stride=10, horizon=200, names=names
    )
    local = build_training_data(load_runs(paths), extractor, stride=10)
    assert list(rows.columns[:-1]) == names
    np.testing.assert_array_equal(rows[names].to_numpy(), local.X[names].to_numpy())
    np.testing.assert_array_equal(rows.iloc[:, -1].to_numpy(), local.y)


def test_a_scheduler_must_be_local_or_an_address():
    with pytest.raises(ValueError, match="tcp://host:8786"), fleet.fleet_client("my-cluster"):
        pass


@pytest.mark.slow
def test_dask_trained_model_ranks_like_the_local_one(tmp_path_factory, tmp_path):
    from collapse_guard.predictor.evaluation import evaluate_runs
    from collapse_guard.predictor.risk import RiskModel
    from collapse_guard.predictor.train import set_levels

    local, _, splits = trained(tmp_path_factory.getbasetemp())
    with fleet.fleet_client("local") as client:
        model, _ = fleet.fit_on_cluster(splits["train"], splits["validation"], client=client)
    set_levels(model, [r for r in splits["validation"] if not r.collapsed])
    assert model.meta["trainer"].startswith("lightgbm.dask on")
    reloaded = RiskModel.load(model.save(tmp_path / "model"))
    assert reloaded.booster.model_to_string() == model.booster.model_to_string()

    dask_row = evaluate_runs(splits["test"], model).get("model")
    local_row = evaluate_runs(splits["test"], local).get("model")
    # lightgbm.dask's model depends on which worker holds which partitions (Dask places
    # them), and PR-AUC on this small test split swings with it, so the ranking is
    # compared by ROC-AUC. On synthetic version 2 (decoys in healthy runs, no shortcuts)
    # the local model and two Dask fits all measured 0.669 here; 0.5 is chance
    assert dask_row["roc_auc"] > 0.62, dask_row
    assert dask_row["roc_auc"] > local_row["roc_auc"] - 0.05, (dask_row, local_row)
    peaks = {r.run_id: model.predict_run(r.frame).max() for r in splits["test"]}
    collapsed = [peaks[r.run_id] for r in splits["test"] if r.collapsed]
    healthy = [peaks[r.run_id] for r in splits["test"] if not r.collapsed]
    assert np.median(collapsed) > np.median(healthy)
