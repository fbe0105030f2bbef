"""Rebuild the default model that ships in the package (``make default-model``).

    python -m collapse_guard.predictor.cli.bundle --real DIR [--real DIR ...] [--synthetic N]
        [--out FOLDER]

Reads the real runs under each ``--real`` folder, adds N synthetic runs generated or
reused from ``--work`` (none by default: beside the real runs they lowered the ROC and PR
AUC on every held-out family; benchmarks/README.md), trains with the same pipeline as
``collapse-guard train`` (``train_risk_model``: run-level split, calibration, levels
cross-fitted by family, evaluation), prints the test-split evaluation beside the
baselines (the headline at the stored ``warn`` level; per kind, cause and onset), and
writes the model folder. The model stores the ids of the runs it trained and validated
on, so ``collapse-guard evaluate`` refuses them. The folder must stay under 5 MB,
because it is installed with every copy of the package.
The previous folder is replaced only once the new one is complete, and only by a model
trained on no fewer runs and no fewer collapses (``meta["bundle"]``) unless ``--force``
(``make default-model ... FORCE=1``): a folder of a few dozen runs once silently replaced
the shipped model. What it replaced is said.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.training.config import TrainConfig

__all__ = [
    "BUNDLE_POSITIVES_WITHIN",
    "DEFAULT_SYNTHETIC",
    "MAX_BYTES",
    "build_default_model",
    "bundled_counts",
    "check_replacement",
    "folder_bytes",
]

MAX_BYTES = 5 * 1024 * 1024  # shipped in the wheel: keep it small
DEFAULT_SYNTHETIC = 0  # synthetic runs did not help on held-out families (module docstring)
# a collapse's positives: its rows within 100 steps of the onset; 100-200 steps ahead of a
# collapse an LR rise causes, the run looks as healthy as the rise it is in (held-out families:
# 52-55 % of the develops caught at warn against 48 % on every row; benchmarks/README.md)
BUNDLE_POSITIVES_WITHIN = 100


def folder_bytes(folder: Path) -> int:
    """Total size of the files under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _data_counts(paths: Sequence[Path]) -> dict[str, int]:
    from collapse_guard.runfiles import read_meta

    collapsed = sum(read_meta(path).onset_step is not None for path in paths)
    return {"runs": len(paths), "collapsed": collapsed}


def bundled_counts(folder: Path) -> tuple[str, dict[str, int | None]] | None:
    """``(version, {"runs", "collapsed"})`` of the model in ``folder``; None when none is.

    Read from its ``risk_model.json`` alone (no booster). A model bundled before the
    counts were kept has its runs from ``n_runs`` and its collapses unknown (None).
    """
    spec = Path(folder) / "risk_model.json"
    if not spec.is_file():
        return None
    meta = json.loads(spec.read_text()).get("meta", {})
    bundle = meta.get("bundle", {})
    runs = bundle.get("runs", sum(meta.get("n_runs", {}).values()) or None)
    return str(meta.get("version", "unversioned")), {
        "runs": runs,
        "collapsed": bundle.get("collapsed"),
    }


def _said(counts: Mapping[str, int | None]) -> str:
    collapsed = counts["collapsed"]
    return f"{counts['runs']} runs, {'?' if collapsed is None else collapsed} collapsed"


def check_replacement(
    folder: Path, counts: Mapping[str, int], *, force: bool = False
) -> tuple[str, dict[str, int | None]] | None:
    """What the new model in ``folder`` would replace (``bundled_counts``), or
    UserInputError when its data set (``counts``: runs, collapsed) is smaller or poorer
    than the replaced model's, unless ``force``."""
    old = bundled_counts(folder)
    if old is None or force:
        return old
    version, was = old
    poorer = [
        what for what in ("runs", "collapsed") if was[what] is not None and counts[what] < was[what]
    ]
    if poorer:
        raise UserInputError(
            f"refusing to replace the model in {folder} ({version}: {_said(was)}) with one "
            f"trained on {_said(counts)}: fewer {' and fewer '.join(poorer)}",
            "point REAL at the whole data set it was trained on (benchmarks/README.md), or "
            "replace it anyway: make default-model REAL=... FORCE=1 (bundle --force)",
        )
    return old


def build_default_model(
    out: Path,
    config: TrainConfig | None = None,
    *,
    synthetic: int = DEFAULT_SYNTHETIC,
    real: Sequence[Path] = (),
    work: Path | None = None,
    workers: int = 1,
    force: bool = False,
    progress=print,
    **settings,
):
    """Train on synthetic (+ real) runs and write the model folder ``out``.

    ``config`` (``settings`` over it, e.g. ``seed=3``): the training, as
    ``train_risk_model``'s; its seed also draws the synthetic runs. Without one, a collapse
    trains on its rows within ``BUNDLE_POSITIVES_WITHIN`` steps of the onset.

    A model already in ``out`` is replaced only by one trained on no fewer runs and no
    fewer collapses, unless ``force`` (``check_replacement``, before any training).
    Returns the :class:`~collapse_guard.predictor.training.train.TrainingResult` (its model as
    written, with the bundle's version and settings in ``meta``).
    """
    from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs
    from collapse_guard.predictor.training.train import train_risk_model
    from collapse_guard.runfiles.records import find_run_files

    if config is None:
        settings.setdefault("positives_within", BUNDLE_POSITIVES_WITHIN)
    config = TrainConfig.of(config, **settings)
    seed = config.seed
    if not real and synthetic <= 0:
        raise UserInputError(
            "the default model needs runs to train on; got no --real folder and --synthetic "
            f"{synthetic}; fix: pass --real DIR (runs of `collapse-guard data real`)"
        )
    with tempfile.TemporaryDirectory(prefix="collapse-guard-bundle-") as tmp:
        runs_dir = work if work is not None else Path(tmp) / "synthetic"
        paths = generate_synthetic_runs(synthetic, runs_dir, seed=seed, workers=workers)
        real_paths = find_run_files(real) if real else []
        progress(f"{len(paths)} synthetic runs in {runs_dir}, {len(real_paths)} real runs")
        counts = _data_counts([*paths, *real_paths])
        replaced = check_replacement(Path(out), counts, force=force)
        result = train_risk_model([*paths, *real_paths], config, progress=progress)
        model = result.model
        model.meta |= {
            # the data, then the model: levels or hold change the answers, not the data
            "version": f"default-{result.fingerprint}-{model.fingerprint()[:8]}",
            "bundle": {"synthetic": synthetic, "real": len(real_paths), "seed": seed, **counts},
        }
        staged = model.save(Path(tmp) / "model")
        size = folder_bytes(staged)
        if size > MAX_BYTES:
            raise ValueError(
                f"the model folder is {size / 1e6:.1f} MB; the bundled model must stay under "
                f"{MAX_BYTES / 1e6:.1f} MB because every install carries it; fix: fewer trees "
                "or leaves (CollapsePredictor n_estimators / num_leaves)"
            )
        out = Path(out)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(staged, out)
    progress(f"wrote {out} ({size / 1024:.0f} KB, {model.meta['n_trees']} trees)")
    if replaced is not None:
        version, was = replaced
        progress(
            f"replaced {version} ({_said(was)}) with {model.meta['version']} ({_said(counts)})"
            + (" [forced]" if force else "")
        )
    return result
