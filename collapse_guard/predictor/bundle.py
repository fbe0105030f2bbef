"""Rebuild the default model that ships in the package (``make default-model``).

    python -m collapse_guard.predictor.bundle --real DIR [--real DIR ...] [--synthetic N]
        [--out FOLDER]

Reads the real runs under each ``--real`` folder, adds N synthetic runs generated or
reused from ``--work`` (none by default: at 486 real runs they lowered the ROC and PR AUC
on every held-out family; benchmarks/README.md), trains with the same pipeline as
``collapse-guard train`` (``train_risk_model``: run-level split, calibration, levels
cross-fitted by family, evaluation), prints the test-split evaluation beside the
baselines (the headline at the stored ``warn`` level; per kind, cause and onset), and
writes the model folder. The model stores the ids of the runs it trained and validated
on, so ``collapse-guard evaluate`` refuses them. The folder must stay under 5 MB,
because it is installed with every copy of the package.
The previous folder is replaced only once the new one is complete.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from collapse_guard.errors import UserInputError, print_error

__all__ = ["MAX_BYTES", "build_default_model", "folder_bytes", "main"]

MAX_BYTES = 5 * 1024 * 1024  # shipped in the wheel: keep it small
DEFAULT_SYNTHETIC = 0  # synthetic runs did not help on held-out families (module docstring)


def folder_bytes(folder: Path) -> int:
    """Total size of the files under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def build_default_model(
    out: Path,
    *,
    synthetic: int = DEFAULT_SYNTHETIC,
    real: Sequence[Path] = (),
    work: Path | None = None,
    seed: int = 0,
    workers: int = 1,
    progress=print,
):
    """Train on synthetic (+ real) runs and write the model folder ``out``.

    Returns the :class:`~collapse_guard.predictor.train.TrainingResult` (its model as
    written, with the bundle's version and settings in ``meta``).
    """
    from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs
    from collapse_guard.predictor.train import train_risk_model
    from collapse_guard.predictor.training_data import find_run_files

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
        result = train_risk_model([*paths, *real_paths], seed=seed, progress=progress)
        model = result.model
        model.meta |= {
            # the data, then the model: levels or hold change the answers, not the data
            "version": f"default-{result.fingerprint}-{model.fingerprint()[:8]}",
            "bundle": {"synthetic": synthetic, "real": len(real_paths), "seed": seed},
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
    return result


def main(argv: Sequence[str] | None = None) -> None:
    from rich.console import Console

    from collapse_guard.predictor.risk import DEFAULT_MODEL_DIR
    from collapse_guard.predictor.tables import print_groups, print_report

    parser = argparse.ArgumentParser(
        prog="python -m collapse_guard.predictor.bundle", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--synthetic",
        type=int,
        default=DEFAULT_SYNTHETIC,
        metavar="N",
        help=f"synthetic runs to generate (default {DEFAULT_SYNTHETIC})",
    )
    parser.add_argument(
        "--real",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="folder of real run files; repeat for more",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_MODEL_DIR,
        help="model folder to write (default: the package's default_model)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="keep the synthetic runs here and reuse them next time",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="processes for generation")
    args = parser.parse_args(argv)
    console = Console()
    try:
        result = build_default_model(
            args.out,
            synthetic=args.synthetic,
            real=args.real,
            work=args.work,
            seed=args.seed,
            workers=args.workers,
            progress=console.log,
        )
    except UserInputError as error:  # one line and exit code 2, as the command line does
        print_error(error)
        raise SystemExit(2) from None
    heading = f"default model {result.model.meta['version']}, test runs"
    print_report(console, result.report, heading)
    print_groups(console, result.report)


if __name__ == "__main__":
    main()
