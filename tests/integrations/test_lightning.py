"""The Lightning callback on a real Trainer: a tiny seeded module, forced actions, CPU."""

from __future__ import annotations

import pytest
import torch
from parameter_snapshots import check_forced_rescue, same, snapshot

L = pytest.importorskip("lightning.pytorch")

from collapse_guard.integrations.lightning import GuardCallback  # noqa: E402
from collapse_guard.runfiles import read_run  # noqa: E402


class Regression(L.LightningModule):
    """A 2-layer MLP on seeded noisy linear targets; keeps every batch's loss."""

    def __init__(self, lr: float = 1e-2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )
        self.lr = lr
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def loader(rows: int = 256, batch: int = 8) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 8, generator=generator)
    y = x @ torch.randn(8, 1, generator=generator) + 0.1 * torch.randn(rows, 1, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)


class Drill(L.Callback):
    """Forces the guard's action at chosen batches; parameters around every batch."""

    def __init__(self, guarded: GuardCallback, actions: dict[int, str]) -> None:
        self.guarded, self.actions = guarded, actions
        self.before: dict[int, list[torch.Tensor]] = {}
        self.after: dict[int, list[torch.Tensor]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before[batch_idx] = snapshot(pl_module)
        if batch_idx in self.actions:
            self.guarded.guard.force_next(self.actions[batch_idx])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after[batch_idx] = snapshot(pl_module)


def fit(tmp_path, actions: dict[int, str], batches: int, config=None, guard=None, **overrides):
    """``guard``: the GuardCallback's keywords over the tests' (risk off, no preflight)."""
    module = Regression()
    keywords = {"risk": "off", "preflight": False, **(guard or {})}
    guarded = GuardCallback(tmp_path / "guard", policy=config, **keywords)
    drill = Drill(guarded, actions)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=batches // overrides.get("accumulate_grad_batches", 1),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[guarded, drill],
        **{"logger": False, **overrides},
    )
    trainer.fit(module, loader())
    return trainer, module, guarded.guard, drill


@pytest.mark.filterwarnings("ignore:collapse-guard preflight")  # constant LR: no warmup
@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_a_forced_skip_leaves_the_parameters_and_the_run_file_records_it(tmp_path):
    # 2 batches a step: step 3 is batches 6 and 7; its action is set before batch 7's step
    trainer, module, guard, drill = fit(
        tmp_path, {7: "skip"}, batches=12, accumulate_grad_batches=2, gradient_clip_val=0.5
    )
    assert same(drill.before[6], drill.after[7])  # the update was not applied
    assert not same(drill.before[4], drill.after[5])  # the others were
    frame, meta = read_run(guard.run_path)
    assert meta.source == "guarded" and len(frame) == 6
    assert list(frame["event"]) == ["", "", "", "skip:forced", "", ""]
    assert meta.extra["guard"]["skipped"] == 1
    # a step's loss is the mean of its two batches' (each given to backward halved)
    pairs = torch.tensor(module.losses).reshape(6, 2).mean(dim=1)
    assert frame["loss"].tolist() == pytest.approx(pairs.tolist(), rel=1e-5)
    # Lightning's clipping became the guard's
    assert guard.policy.clip == 0.5 and trainer.gradient_clip_val is None


@pytest.mark.filterwarnings("ignore:collapse-guard preflight")
@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_a_forced_rescue_rolls_back_skips_batches_and_halves_the_lr(tmp_path):
    actions = {1: "checkpoint", 2: "checkpoint", 4: "rescue"}
    # both checkpoints count as one basin whatever their losses: the drill checks the mean
    config = {"skip_batches": 2, "rescue_lr": 0.5, "average_loss_gap": 1e9}
    _, _, guard, drill = fit(tmp_path, actions, batches=9, config=config)
    check_forced_rescue(drill, guard, lr=1e-2)


@pytest.mark.filterwarnings("ignore:collapse-guard preflight")
@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_16_mixed_with_its_grad_scaler_is_unscaled_once_as_in_a_plain_loop(tmp_path):
    from lightning.pytorch.plugins.precision import MixedPrecision

    _, _, plain, _ = fit(tmp_path / "fp32", {}, batches=6)
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=1024.0
    )  # 65536: fp16 overflows  # Lightning makes one on a GPU only: by hand
    mixed = MixedPrecision("16-mixed", "cpu", scaler=scaler)
    trainer, module, guard, drill = fit(tmp_path / "fp16", {}, batches=6, plugins=[mixed])
    assert guard.scaler is scaler and trainer.precision_plugin.scaler is scaler  # put back
    assert not same(drill.before[0], drill.after[5])
    frame, _ = read_run(guard.run_path)
    reference, _ = read_run(plain.run_path)
    assert frame["loss_scale"].tolist() == [1024.0] * 6 and frame["overflow"].sum() == 0
    # the hook's loss comes scaled: the scale is divided out
    assert frame["loss"].tolist() == pytest.approx(module.losses, rel=1e-6)
    # the gradients unscaled once (Lightning's unscale_, the guard's none): the fp32 run's
    # norm at the same first step, not 1/1024 (twice) or 1024 times it (never)
    assert frame["grad_norm"].iloc[0] == pytest.approx(reference["grad_norm"].iloc[0], rel=0.02)
    assert int(scaler._growth_tracker) == 6  # one update per step: the guard's alone


@pytest.mark.filterwarnings("ignore:collapse-guard preflight")
@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_the_guards_numbers_reach_a_csv_logger_and_the_trackers(tmp_path):
    import pandas as pd
    from lightning.pytorch.loggers import CSVLogger

    sent = []
    keywords = {"risk": None, "trackers": lambda metrics, step: sent.append((step, metrics))}
    logger = CSVLogger(tmp_path / "logs", name="guarded", version=0)
    _, _, guard, _ = fit(  # the embedded risk model
        tmp_path, {3: "skip", 5: "checkpoint"}, batches=30, guard=keywords, logger=logger,
        log_every_n_steps=10,
    )  # fmt: skip
    frame = pd.read_csv(tmp_path / "logs" / "guarded" / "version_0" / "metrics.csv")
    # Lightning's row of step 9 is written after the 10th optimizer step (global_step 10)
    assert frame["step"].tolist() == [9, 19, 29]
    assert frame["guard/actions/skip"].tolist() == [1.0] * 3
    # the forced one at step 5, then one at `watch` where the embedded model reads it (a
    # checkpoint at watch every watch_checkpoint_gap steps): counts, so never falling
    checkpoints = frame["guard/actions/checkpoint"]
    assert checkpoints.iloc[0] == 1.0 and checkpoints.is_monotonic_increasing
    assert checkpoints.iloc[-1] == guard.summary()["checkpoints"]
    assert (
        frame["guard/actions/rescue"].tolist()
        == [0.0] * 3
        == frame["guard/actions/qk_clip"].tolist()
    )
    assert frame["guard/lr_scale"].tolist() == [guard.run.lr_multiplier] * 3
    # the windows of steps 9 and 19 are scored, each heard a step later: none in the first row
    readings = guard.run.risk_readings
    assert [step for step, _ in readings] == [9, 19]
    assert frame["guard/risk"].isna().tolist() == [True, False, False]
    assert frame["guard/risk"].iloc[1:].tolist() == pytest.approx([p for _, p in readings])
    assert frame["guard/level"].iloc[-1] == guard.run.level.rank
    # the trackers get the same numbers, at the loggers' cadence
    assert [step for step, _ in sent] == [10, 20, 30]
    for (_, metrics), (_, row) in zip(sent, frame.iterrows(), strict=True):
        assert all(row[k] == pytest.approx(v) for k, v in metrics.items())
