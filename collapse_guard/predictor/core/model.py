"""CollapsePredictor: a LightGBM binary classifier under the scikit-learn contract.

``__init__`` only stores hyperparameters; ``fit(X, y)`` returns ``self`` and discards any
previous fit; what is learned ends with ``_`` (``booster_``, ``classes_``,
``feature_names_in_`` when fitted on a DataFrame, ``n_features_in_``, ``horizon_``,
``best_iteration_``). NaN is a valid input (LightGBM's "missing"); never fill it.

LightGBM's own training API is used (not ``LGBMClassifier``) so that the fitted model is
one plain ``lightgbm.Booster`` that saves to text (no pickle) and is deterministic:
``deterministic=True``, ``force_row_wise=True`` and a fixed seed give the same model
string for the same data.
"""

from __future__ import annotations

from collections.abc import Sequence

import lightgbm as lgb
import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from collapse_guard.runfiles.label import HORIZON

__all__ = ["DEFAULT_STRIDE", "CollapsePredictor", "FeatureMismatchError", "check_feature_names"]

# A model is fitted on the window ending at every 10th step of a run: neighbouring windows
# share 199 of 200 steps (training.data says why 10); the learned baselines draw theirs alike.
DEFAULT_STRIDE = 10


class FeatureMismatchError(ValueError):
    """The columns given to predict do not match those seen at fit time."""


def check_feature_names(expected: Sequence[str], got: Sequence[str]) -> None:
    """Raise FeatureMismatchError listing missing and unexpected names, if any differ.

    Columns in another order are accepted by the callers (they reorder); only a
    different set of names is an error.
    """
    expected_set, got_set = set(expected), set(got)
    if expected_set == got_set:
        return
    missing = [n for n in expected if n not in got_set]
    unexpected = [n for n in got if n not in expected_set]
    parts = [f"feature names differ from those seen at fit ({len(expected)} expected)"]
    if missing:
        parts.append("missing: " + ", ".join(missing))
    if unexpected:
        parts.append("unexpected: " + ", ".join(unexpected))
    parts.append(
        "fix: compute features with the extractor of the model's schema "
        "(FeatureExtractor.from_schema(model.schema))"
    )
    raise FeatureMismatchError("; ".join(parts))


class CollapsePredictor(ClassifierMixin, BaseEstimator):
    """P(collapse within the horizon) from a feature vector.

    Args:
        n_estimators: most boosting rounds; early stopping on ``eval_set`` may use fewer.
            300 rounds of 31 leaves keep the text model well under 5 MB.
        learning_rate: shrinkage per round.
        num_leaves: leaves per tree. 15 (not LightGBM's 31): on 300 synthetic runs it
            matched 31 leaves on validation AUC in half the fit time.
        min_child_samples: fewest rows in a leaf; guards against memorising one run's
            quirks (with few runs, train AUC reaches 1.0 while validation stalls).
        subsample: row fraction per round (bagging), with ``subsample_freq=1``.
        colsample_bytree: feature fraction per tree (0.5: ~240 correlated features).
        reg_lambda: L2 penalty on leaf values.
        early_stopping_rounds: stop when the validation log loss has not improved for
            this many rounds (only with ``eval_set``).
        horizon: steps ahead the targets look (stored as ``horizon_``; descriptive).
        n_jobs: LightGBM threads (1 on shared machines; docs/stack.md, "OpenMP").
        random_state: seed for bagging and feature sampling.
    """

    def __init__(
        self,
        n_estimators: int = 300,
        learning_rate: float = 0.05,
        num_leaves: int = 15,
        min_child_samples: int = 100,
        subsample: float = 0.8,
        colsample_bytree: float = 0.5,
        reg_lambda: float = 1.0,
        early_stopping_rounds: int = 50,
        horizon: int = HORIZON,
        n_jobs: int = 1,
        random_state: int = 0,
    ) -> None:
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.reg_lambda = reg_lambda
        self.early_stopping_rounds = early_stopping_rounds
        self.horizon = horizon
        self.n_jobs = n_jobs
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        tags.classifier_tags.multi_class = False
        return tags

    def lgb_params(self) -> dict:
        """The LightGBM parameters these hyperparameters map to."""
        return {
            "objective": "binary",
            "learning_rate": self.learning_rate,
            "num_leaves": self.num_leaves,
            "min_data_in_leaf": self.min_child_samples,
            "bagging_fraction": self.subsample,
            "bagging_freq": 1 if self.subsample < 1.0 else 0,
            "feature_fraction": self.colsample_bytree,
            "lambda_l2": self.reg_lambda,
            "num_threads": self.n_jobs,
            "seed": self.random_state,
            "deterministic": True,
            "force_row_wise": True,
            "verbosity": -1,
        }

    def _encode_y(self, y: np.ndarray) -> np.ndarray:
        check_classification_targets(y)  # "Unknown label type: continuous" for floats
        if type_of_target(y) == "multiclass":
            raise ValueError(
                "Only binary classification is supported. CollapsePredictor predicts "
                f"collapse (1) or not (0); got classes {np.unique(y).tolist()[:10]}"
            )
        classes = np.unique(y)
        if classes.size != 2:
            raise ValueError(
                f"CollapsePredictor is a binary classifier and needs exactly 2 classes in y; "
                f"got {classes.size} class(es): {classes.tolist()[:10]}. Fix: train on runs "
                "that include both collapsing and healthy windows"
            )
        self.classes_ = classes
        return (y == classes[1]).astype(np.float64)

    def fit(self, X, y, sample_weight=None, *, eval_set: tuple | None = None) -> CollapsePredictor:
        """Fit on features ``X`` (DataFrame or array, NaN allowed) and binary labels ``y``.

        ``sample_weight``: one non-negative weight per row (None: all 1).
        ``eval_set=(X_val, y_val)`` turns on early stopping on validation log loss
        (unweighted: the log loss the risk is calibrated for).
        """
        for attr in ("booster_", "best_iteration_", "feature_names_in_"):
            self.__dict__.pop(attr, None)  # a refit starts from nothing
        X, y = validate_data(self, X, y, reset=True, ensure_all_finite="allow-nan")
        target = self._encode_y(y)
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, X, ensure_non_negative=True)
        train = lgb.Dataset(
            X,
            label=target,
            weight=sample_weight,
            feature_name=self._lgb_names(),
            free_raw_data=True,
        )
        callbacks, valid_sets = [], []
        if eval_set is not None:
            X_val = self._validated(eval_set[0])
            y_val = (np.asarray(eval_set[1]) == self.classes_[1]).astype(np.float64)
            valid_sets = [lgb.Dataset(X_val, label=y_val, reference=train)]
            callbacks = [lgb.early_stopping(self.early_stopping_rounds, verbose=False)]
        self.booster_ = lgb.train(
            self.lgb_params(),
            train,
            num_boost_round=self.n_estimators,
            valid_sets=valid_sets,
            callbacks=callbacks,
        )
        best = self.booster_.best_iteration
        self.best_iteration_ = int(best) if best and best > 0 else self.booster_.num_trees()
        if eval_set is not None:
            # keep only the trees early stopping chose, so the saved model is the used one
            self.booster_ = lgb.Booster(
                model_str=self.booster_.model_to_string(num_iteration=self.best_iteration_)
            )
        self.horizon_ = int(self.horizon)
        return self

    def _lgb_names(self) -> list[str]:
        if hasattr(self, "feature_names_in_"):
            return [str(n) for n in self.feature_names_in_]
        return [f"f{i}" for i in range(self.n_features_in_)]

    def _validated(self, X) -> np.ndarray:
        """Check names (listing missing/unexpected) and shape; reorder columns if needed."""
        check_is_fitted(self)
        if isinstance(X, pd.DataFrame) and hasattr(self, "feature_names_in_"):
            expected = list(self.feature_names_in_)
            check_feature_names(expected, [str(c) for c in X.columns])
            X = X[expected]
        return validate_data(self, X, reset=False, ensure_all_finite="allow-nan")

    def raw_proba(self, X) -> np.ndarray:
        """P(class 1) as the booster gives it (before any calibration), shape (n,)."""
        X = self._validated(X)
        return self.booster_.predict(X, num_threads=self.n_jobs)

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities, shape (n, 2), columns in ``classes_`` order."""
        p1 = self.raw_proba(X)
        return np.column_stack([1.0 - p1, p1])

    def predict(self, X) -> np.ndarray:
        """The more likely class of each row."""
        check_is_fitted(self)
        return self.classes_[(self.raw_proba(X) >= 0.5).astype(int)]
