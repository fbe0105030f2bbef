"""RiskModel: the trained predictor as users, the service and the guard see it.

>>> model = RiskModel.load()                  # the default model bundled in the package
>>> risk = model.predict_run(frame)           # pd.Series: P(collapse within horizon) by step
>>> model.level(risk.iloc[-1]), model.thresholds

The levels are set on the risk held over ``hold_steps`` steps (:mod:`.hold`), which
``predict_run`` gives; ``predict_window`` gives one window's own risk, which a loop holds
with :class:`~collapse_guard.predictor.core.hold.RiskHold` (the guard does).

A model is a folder of two plain files, never a pickle:

====================  =========================================================
file                  what
====================  =========================================================
``model.txt``         the LightGBM booster, as ``Booster.model_to_string()``
``risk_model.json``   format version, feature schema, calibration, level
                      thresholds and budgets, horizon, hold steps (absent in
                      older files: 0, no hold), and ``meta`` (name,
                      version, trained_at, data and schema fingerprints, ...)
====================  =========================================================

Loading checks that the stored feature schema is exactly what this code's
feature extractor computes (version, window, signals, names); a mismatch is an error
that says how to fix it, never silently wrong probabilities. The folder is read by
:mod:`.model_file`, the one loader: ``model.txt`` proven whole and readable by LightGBM in
a child process before it is parsed here, levels and hold checked (a NaN, > 1,
negative or unordered level, or a hold outside [0, 10,000], is a ModelFormatError).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd

from collapse_guard.features import FEATURE_VERSION, FeatureExtractor, FeatureSchema
from collapse_guard.features.context import opt_in_of
from collapse_guard.predictor.core import store
from collapse_guard.predictor.core.calibration import Calibrator
from collapse_guard.predictor.core.hold import hold_risk
from collapse_guard.predictor.core.levels import DEFAULT_BUDGETS, LEVELS, Level, level_of
from collapse_guard.predictor.core.model import check_feature_names
from collapse_guard.predictor.core.model_file import (
    BOOSTER_FILE,
    FORMAT_VERSION,
    SPEC_FILE,
    ModelFormatError,
    read_model_folder,
)

__all__ = [
    "DEFAULT_MODEL_DIR",
    "FORMAT_VERSION",
    "MODEL_NAME",
    "ModelFormatError",
    "RiskModel",
]

MODEL_NAME = "collapse-predictor"
DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[1] / "default_model"  # predictor/default_model
_BOOSTER_FILE = BOOSTER_FILE
_SPEC_FILE = SPEC_FILE


class RiskModel:
    """A calibrated collapse predictor with its feature schema and alarm levels.

    Build one with :func:`collapse_guard.predictor.training.train.train_risk_model` or load
    one with :meth:`load`. Probabilities are calibrated; ``thresholds`` are on the
    same calibrated scale, for the risk held over ``hold_steps`` steps.
    """

    def __init__(
        self,
        booster: lgb.Booster,
        schema: FeatureSchema,
        calibrator: Calibrator,
        thresholds: Mapping[str, float],
        *,
        horizon: int,
        budgets: Mapping[str, float] = DEFAULT_BUDGETS,
        hold_steps: int = 0,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        check_feature_names(schema.names, booster.feature_name())
        self.booster = booster
        self.schema = schema
        self.calibrator = calibrator
        # keyed by the levels' names, whatever the caller's keys (levels.py says why)
        self._thresholds = {str(k): float(v) for k, v in thresholds.items()}
        self.horizon = int(horizon)
        self.budgets = {str(k): v for k, v in budgets.items()}
        self.hold_steps = int(hold_steps)
        self.extractor = FeatureExtractor.from_schema(schema)  # opt-in context fields too
        self.meta = {
            "name": MODEL_NAME,
            "version": "local",
            **dict(meta or {}),
            "schema_fingerprint": schema.fingerprint,
            "feature_version": schema.version,
            "horizon": self.horizon,
            "n_trees": booster.num_trees(),
        }

    # ------------------------------------------------------------------ levels
    @property
    def thresholds(self) -> dict[str, float]:
        """{"watch": p, "warn": p, "critical": p} on the calibrated scale."""
        return dict(self._thresholds)

    def with_thresholds(self, thresholds: Mapping[str, float]) -> RiskModel:
        """Set the level thresholds (all of LEVELS) and return self."""
        if set(thresholds) != set(LEVELS):
            names = [level.value for level in LEVELS]  # a list of Levels would print reprs
            raise ValueError(
                f"thresholds must name exactly {names}; got {sorted(map(str, thresholds))}"
            )
        self._thresholds = {level.value: float(thresholds[level]) for level in LEVELS}
        return self

    def calibrate(
        self,
        runs,
        *,
        budgets: Mapping[str, float] | None = None,
        confidence: float | None = None,
    ) -> RiskModel:
        """A copy whose levels hold their budgets on your healthy ``runs`` (run files, folders
        of them or frames); booster, probability calibration and hold unchanged.

        See :func:`collapse_guard.predictor.core.recalibrate.calibrate` (how few healthy steps
        are handled, what is refused).
        """
        # imported here: it reads run files (pyarrow, labelling), which scoring never needs
        from collapse_guard.predictor.core import recalibrate

        if confidence is None:
            confidence = recalibrate.DEFAULT_CONFIDENCE
        return recalibrate.calibrate(self, runs, budgets=budgets, confidence=confidence)

    def level(self, p: float) -> Level:
        """OK, WATCH, WARN or CRITICAL for a calibrated probability ``p``."""
        if not self._thresholds:
            raise RuntimeError("this model has no level thresholds yet; set them with_thresholds()")
        return level_of(p, self._thresholds)

    # ------------------------------------------------------------- prediction
    def raw_features(self, X: pd.DataFrame | np.ndarray) -> np.ndarray:
        """Uncalibrated P(collapse) for feature rows (DataFrame columns checked by name)."""
        if isinstance(X, pd.DataFrame):
            check_feature_names(self.schema.names, [str(c) for c in X.columns])
            X = X[list(self.schema.names)].to_numpy(dtype=np.float64)
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(self.schema.names):
            raise ValueError(
                f"feature rows must have shape (n, {len(self.schema.names)}) for schema "
                f"{self.schema.fingerprint}; got {X.shape}. Fix: compute them with "
                "model.extractor"
            )
        if X.shape[0] == 0:
            return np.empty(0)
        # one thread: single rows are 400x faster, batches barely slower (docs/stack.md, "OpenMP")
        return self.booster.predict(X, num_threads=1)

    def predict_features(self, X: pd.DataFrame | np.ndarray) -> np.ndarray:
        """Calibrated P(collapse within ``horizon``) for feature rows."""
        return self.calibrator.transform(self.raw_features(X))

    def predict_run(
        self,
        frame: pd.DataFrame,
        *,
        stride: int = 1,
        steps: Sequence[int] | None = None,
        held: bool = True,
    ) -> pd.Series:
        """P(collapse within ``horizon``) at every ``stride``-th step of a run.

        ``frame``: column ``step`` plus whatever signal columns the run has (missing
        signals are NaN features). Steps run over the whole range, gaps included, unless
        ``steps`` names the window ends (e.g. ``frame["step"]``: only recorded rows).
        ``held``: each step's risk is the highest of the last ``hold_steps`` steps' (what
        the levels are set on); False: each window's own, as ``predict_window`` gives it.
        Returns a Series indexed by step, named ``p_collapse``.
        """
        feats = self.extractor.transform_run(frame, stride=stride, steps=steps)
        p = self.predict_features(feats)
        if held:
            p = hold_risk(feats.index, p, self.hold_steps)
        return pd.Series(p, index=feats.index, name="p_collapse")

    def predict_window(
        self, frame: pd.DataFrame, context: Mapping[str, float] | None = None
    ) -> float:
        """P(collapse) for the window ending at the last row of ``frame``.

        ``context``: the run context at that row, keyed by ``schema.context``
        (``RunContext.from_schema(model.schema).get()``; a missing field is unknown,
        an unknown one an error). None computes it from ``frame`` as the whole run so
        far: pass the whole run, or a context, when the frame holds only its last window.
        """
        vec = self.extractor.transform_window(frame, context)
        return float(self.predict_features(vec[np.newaxis, :])[0])

    def predict_windows(
        self,
        frames: Sequence[pd.DataFrame],
        contexts: Sequence[Mapping[str, float] | None] | None = None,
    ) -> np.ndarray:
        """P(collapse) for many windows (one per frame, each ending at its last row),
        with one context per frame (or None: each computed from its frame)."""
        if len(frames) == 0:
            return np.empty(0)
        feats = self.extractor.transform_windows(list(frames), contexts)
        return self.predict_features(feats)

    def fingerprint(self) -> str:
        """16 hex digits of what decides every answer: trees, calibration, levels, hold.

        The data fingerprint alone names the runs, not the model: the same runs with
        other levels or another hold give other alarms."""
        answers = {
            "calibration": self.calibrator.to_dict(),
            "thresholds": self._thresholds,
            "hold_steps": self.hold_steps,
            "horizon": self.horizon,
        }
        digest = hashlib.sha256(self.booster.model_to_string().encode())
        digest.update(json.dumps(answers, sort_keys=True, default=_json_default).encode())
        return digest.hexdigest()[:16]

    # ------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        """Write ``model.txt`` and ``risk_model.json`` into ``folder`` (created)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / _BOOSTER_FILE).write_text(self.booster.model_to_string(), encoding="utf-8")
        spec = {
            "format_version": FORMAT_VERSION,
            "schema": self.schema.to_dict(),
            "calibration": self.calibrator.to_dict(),
            "thresholds": self._thresholds,
            "budgets": self.budgets,
            "horizon": self.horizon,
            "hold_steps": self.hold_steps,
            "meta": self.meta,
        }
        text = json.dumps(spec, indent=2, sort_keys=True, default=_json_default)
        (folder / _SPEC_FILE).write_text(text + "\n", encoding="utf-8")
        return folder

    @classmethod
    def load(cls, source: str | Path | None = None) -> RiskModel:
        """Load the bundled default (None), a registry URI or a model folder.

        ``"models:/collapse-predictor@champion"`` and ``"runs:/..."`` go through the
        MLflow store (``predictor.core.store``; mlflow imported only then); anything else is
        a folder path.
        """
        if source is None:
            if not (DEFAULT_MODEL_DIR / _SPEC_FILE).is_file():
                raise FileNotFoundError(
                    f"no bundled default model at {DEFAULT_MODEL_DIR}; build it with "
                    "`make default-model` (python -m collapse_guard.predictor.cli.bundle), or pass "
                    "a model folder or 'models:/collapse-predictor@champion'"
                )
            return cls.load_folder(DEFAULT_MODEL_DIR)
        if store.is_registry_uri(source):
            with store.fetched_model_folder(source) as (folder, stamp):
                model = cls.load_folder(folder)
            # the folder was saved before the registry numbered it: name the version loaded
            model.meta |= {**stamp, "source": source}
            return model
        return cls.load_folder(Path(source))

    @classmethod
    def load_folder(cls, folder: str | Path) -> RiskModel:
        """Load a folder written by :meth:`save`, checking format, levels, hold and
        feature schema, its ``model.txt`` proven whole and readable by LightGBM in a child
        process first (:func:`~collapse_guard.predictor.core.model_file.read_model_folder`:
        a damaged file is a ModelFileError, never this process's crash)."""
        folder = Path(folder)
        files = read_model_folder(folder)
        spec = files.spec
        # the version first: an older schema dict lacks keys this code's has (context)
        _check_version(spec["schema"].get("version"), folder)
        schema = FeatureSchema.from_dict(spec["schema"])
        _check_schema(schema, folder)
        # the very bytes the child loaded: nothing here parses what it could not
        booster = lgb.Booster(model_str=files.booster_text)
        model = cls(
            booster,
            schema,
            Calibrator.from_dict(spec["calibration"]),
            files.thresholds,
            horizon=spec["horizon"],
            budgets=spec.get("budgets", DEFAULT_BUDGETS),
            hold_steps=files.hold_steps,  # absent before the hold: 0, levels on raw risk
            meta=spec.get("meta", {}),
        )
        model.meta["source"] = str(folder)
        return model

    def __repr__(self) -> str:
        return (
            f"RiskModel(name={self.meta['name']!r}, version={self.meta['version']!r}, "
            f"horizon={self.horizon}, hold_steps={self.hold_steps}, "
            f"schema={self.schema.fingerprint}, "
            f"thresholds={self._thresholds})"
        )


def _check_version(version: Any, folder: Path) -> None:
    if version != FEATURE_VERSION:
        raise ModelFormatError(
            f"{folder}: the model was trained on feature version {version!r}, this "
            f"code computes version {FEATURE_VERSION!r}; its probabilities would be wrong. "
            "Fix: retrain it (make default-model for the bundled one) or install the "
            "collapse-guard release that trained it"
        )


def _check_schema(schema: FeatureSchema, folder: Path) -> None:
    _check_version(schema.version, folder)
    current = FeatureSchema.build(schema.window, schema.signals, opt_in_of(schema.context))
    if current.names != schema.names or current.context != schema.context:
        missing = [n for n in schema.names if n not in set(current.names)]
        extra = [n for n in current.names if n not in set(schema.names)]
        raise ModelFormatError(
            f"{folder}: stored feature names differ from what feature version "
            f"{FEATURE_VERSION} computes for window {schema.window} (not computed any more: "
            f"{missing[:10]}; new: {extra[:10]}); retrain the model"
        )


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")
