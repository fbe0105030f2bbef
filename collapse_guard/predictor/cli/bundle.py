"""``python -m collapse_guard.predictor.cli.bundle`` (``make default-model``): the bundled
model rebuilt (``lifecycle.bundle``) and its test-split evaluation printed.

Without ``--real`` it trains on the whole corpus pack of a source checkout (every folder of
run files under ``corpus/``: ``real``, ``breadth``; corpus/README.md), so a fresh clone
rebuilds the model from the repository alone."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from collapse_guard.errors import UserInputError, print_error
from collapse_guard.predictor.lifecycle import bundle

__all__ = ["CORPUS_PACK", "corpus_folders", "main"]

# the run files kept in the repository; absent from an installed package
CORPUS_PACK = Path(__file__).resolve().parents[3] / "corpus"


def corpus_folders(pack: Path = CORPUS_PACK) -> list[Path]:
    """The pack's folders that hold run files, in name order (none outside a checkout)."""
    if not pack.is_dir():
        return []
    return [d for d in sorted(pack.iterdir()) if d.is_dir() and any(d.glob("*.parquet"))]


def main(argv: Sequence[str] | None = None) -> None:
    from rich.console import Console

    from collapse_guard.predictor.cli.tables import print_groups, print_report
    from collapse_guard.predictor.core.risk import DEFAULT_MODEL_DIR

    parser = argparse.ArgumentParser(
        prog="python -m collapse_guard.predictor.cli.bundle",
        description=bundle.__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--synthetic",
        type=int,
        default=bundle.DEFAULT_SYNTHETIC,
        metavar="N",
        help=f"synthetic runs to generate (default {bundle.DEFAULT_SYNTHETIC})",
    )
    parser.add_argument(
        "--real",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help=f"folder of real run files; repeat for more (default: every folder under "
        f"{CORPUS_PACK})",
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
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the model in --out even with one trained on fewer runs or collapses",
    )
    args = parser.parse_args(argv)
    args.real = args.real or corpus_folders()
    console = Console()
    try:
        result = bundle.build_default_model(
            args.out,
            synthetic=args.synthetic,
            real=args.real,
            work=args.work,
            seed=args.seed,
            workers=args.workers,
            force=args.force,
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
