"""Fleet training: features on Dask workers, lightgbm.dask fit, same pipeline afterwards."""

from __future__ import annotations

import numpy as np
import pytest
from ops_fixtures import synthetic_run_paths, trained
from sklearn.metrics import roc_auc_score

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
def test_dask_trained_model_round_trips_and_learns_its_training_rows(tmp_path_factory, tmp_path):
    from collapse_guard.predictor.risk import RiskModel
    from collapse_guard.predictor.train import set_levels
    from collapse_guard.predictor.training_data import build_training_data

    _, _, splits = trained(tmp_path_factory.getbasetemp())
    with fleet.fleet_client("local") as client:
        model, _ = fleet.fit_on_cluster(splits["train"], splits["validation"], client=client)
    set_levels(model, [r for r in splits["validation"] if not r.collapsed])
    assert model.meta["trainer"].startswith("lightgbm.dask on")
    reloaded = RiskModel.load(model.save(tmp_path / "model"))
    assert reloaded.booster.model_to_string() == model.booster.model_to_string()

    # What the Dask fit learned, on its own training rows (each partition bins its own
    # data, so on 48 runs the fit is not the local one). On synthetic version 2 (decoys,
    # no shortcuts) its test ranking fell to row ROC-AUC 0.53 against 0.67 for the local
    # fit (Spearman -0.54 between the two): the fleet path needs larger data or shared
    # bin boundaries before it ranks like the local model (issue 11), so this test pins
    # that it learns, not that it generalises like the local fit
    rows = build_training_data(splits["train"], model.extractor, stride=10)
    assert roc_auc_score(rows.y, model.predict_features(rows.X)) > 0.8
