"""The training options every training command takes (``train``, ``evaluate
--leave-one-out``, ``retrain``): one surface, turned into one ``TrainConfig``.

Defaults are the config's own (``None`` here), so a default changes in one place; the
config is built inside the command, so that ``collapse-guard --help`` imports no LightGBM.
``retrain`` takes the flags given (:func:`training_settings`) over the champion's own
training, the others over the defaults (:func:`train_config`).
"""

from __future__ import annotations

import typer

from collapse_guard.errors import UserInputError

__all__ = [
    "HOLD",
    "POSITIVES",
    "RISE_WEIGHT",
    "SEED",
    "STRIDE",
    "train_config",
    "training_settings",
]

SEED = typer.Option(help="Seeds the run split, LightGBM and the learned baselines.")
STRIDE = typer.Option(
    help="Training rows at every N-th step (default: the training's own, "
    "predictor.core.model.DEFAULT_STRIDE; retrain: the champion's); evaluation still scores "
    "every step."
)
HOLD = typer.Option(
    help="The levels are set on the risk held this many steps (the highest window risk of "
    "the last N steps; 0: each window's own). Default: predictor.core.hold.DEFAULT_HOLD_STEPS "
    "(retrain: the champion's)."
)

POSITIVES = typer.Option(
    help="A collapse trains as positives its rows within N steps of the onset; those further "
    "ahead inside the horizon train nothing (0: every row of the horizon). Default: "
    "predictor.training.data.POSITIVES_WITHIN (retrain: the champion's)."
)

RISE_WEIGHT = typer.Option(
    help="A healthy row inside an LR rise (the LR rose within the last 200 steps) weighs W in "
    "the fit (1: as any row). Default: predictor.training.data.HEALTHY_RISE_WEIGHT (retrain: "
    "the champion's)."
)


def train_config(**flags):
    """The ``TrainConfig`` of the flags (:func:`training_settings`) over the defaults."""
    from collapse_guard.predictor.training.config import TrainConfig

    return TrainConfig(**training_settings(**flags))


def training_settings(
    *,
    seed: int,
    stride: int | None,
    hold_steps: int | None,
    positives_within: int | None = None,
    healthy_rise_weight: float | None = None,
    **more,
) -> dict:
    """The settings the flags give (those left out: absent), a bad value named by its flag."""
    if stride is not None and stride < 1:
        raise UserInputError(f"--stride must be 1 or more steps; got {stride}", "e.g. --stride 10")
    if hold_steps is not None and hold_steps < 0:
        raise UserInputError(
            f"--hold-steps must be 0 or more steps; got {hold_steps}", "e.g. --hold-steps 50"
        )
    if healthy_rise_weight is not None and not healthy_rise_weight > 0:
        raise UserInputError(
            f"--healthy-rise-weight must be a positive number; got {healthy_rise_weight}",
            "e.g. --healthy-rise-weight 3 (1: every row weighs the same)",
        )
    from collapse_guard.predictor.training.config import TrainConfig

    if positives_within is not None and not 0 <= positives_within <= TrainConfig.horizon:
        raise UserInputError(
            f"--positives-within must be 0 to the horizon ({TrainConfig.horizon}) steps; "
            f"got {positives_within}",
            "e.g. --positives-within 100 (0: every row of the horizon)",
        )
    flags = {"stride": stride, "hold_steps": hold_steps, "healthy_rise_weight": healthy_rise_weight}
    given = {k: v for k, v in flags.items() if v is not None}
    if positives_within is not None:
        given["positives_within"] = positives_within or None  # 0: every row of the horizon
    return {"seed": seed, **given, **more}
