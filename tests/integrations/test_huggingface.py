"""The transformers callback on a real Trainer: a tiny random GPT-2, forced actions, CPU."""

from __future__ import annotations

import pytest
import torch
from parameter_snapshots import check_forced_rescue, same, snapshot

pytest.importorskip("accelerate")  # the Trainer refuses to start without it
transformers = pytest.importorskip("transformers")

from collapse_guard.integrations.huggingface import GuardCallback  # noqa: E402
from collapse_guard.runfiles import read_run  # noqa: E402

VOCAB, SEQ = 64, 16


class Tokens(torch.utils.data.Dataset):
    """Seeded random token rows, each its own labels (causal LM)."""

    def __init__(self, rows: int = 64, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (rows, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Drill(transformers.TrainerCallback):
    """Forces the guard's action at chosen optimizer steps; parameters around every step."""

    def __init__(self, guarded: GuardCallback, actions: dict[int, str]) -> None:
        self.guarded, self.actions = guarded, actions
        self.before: dict[int, list[torch.Tensor]] = {}
        self.after: dict[int, list[torch.Tensor]] = {}

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.before[state.global_step] = snapshot(model)
        if state.global_step in self.actions:
            self.guarded.guard.force_next(self.actions[state.global_step])

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after[state.global_step - 1] = snapshot(model)


def train(
    tmp_path, actions: dict[int, str], steps: int, config=None, scaler=None, guard=None, **overrides
):
    """``guard``: the GuardCallback's keywords over the tests' (risk off, no preflight)."""
    torch.manual_seed(0)
    config_2 = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32
    )
    model = transformers.GPT2LMHeadModel(config_2)
    keywords = {"risk": "off", "preflight": False, **(guard or {})}
    guarded = GuardCallback(tmp_path / "guard", policy=config, **keywords)
    drill = Drill(guarded, actions)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **{"logging_steps": 1, "report_to": [], **overrides},
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(), callbacks=[guarded, drill]
    )
    if scaler is not None:  # accelerate makes a GradScaler on a GPU only: here, by hand
        trainer.accelerator.scaler = scaler
    trainer.train()
    return trainer, guarded.guard, drill


@pytest.mark.filterwarnings("ignore:collapse-guard preflight")  # constant LR: no warmup
def test_a_forced_skip_leaves_the_parameters_and_the_run_file_records_it(tmp_path):
    trainer, guard, drill = train(
        tmp_path, {3: "skip"}, steps=6, gradient_accumulation_steps=2, max_grad_norm=0.5
    )
    assert same(drill.before[3], drill.after[3])  # the update was not applied
    assert not same(drill.before[2], drill.after[2])  # the others were
    frame, meta = read_run(guard.run_path)
    assert meta.source == "guarded" and len(frame) == 6
    assert list(frame["event"]) == ["", "", "", "skip:forced", "", ""]
    assert meta.extra["guard"]["skipped"] == 1
    # the step's loss is the Trainer's: 2 accumulated micro-batches, as it logs them
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert frame["loss"].tolist() == pytest.approx(logged, rel=1e-3)
    # the Trainer's clipping became the guard's, and is the Trainer's again after
    assert guard.policy.clip == 0.5 and trainer.args.max_grad_norm == 0.5


@pytest.mark.filterwarnings("ignore:collapse-guard preflight")
def test_a_forced_rescue_rolls_back_skips_batches_and_halves_the_lr(tmp_path):
    actions = {1: "checkpoint", 2: "checkpoint", 4: "rescue"}
    config = {"skip_batches": 2, "rescue_lr": 0.5}
    _, guard, drill = train(tmp_path, actions, steps=9, config=config)
    check_forced_rescue(drill, guard, lr=1e-3)


@pytest.mark.filterwarnings("ignore:collapse-guard preflight")
def test_fp16_with_the_trainers_grad_scaler_is_unscaled_once_as_in_a_plain_loop(tmp_path):
    _, plain, _ = train(tmp_path / "fp32", {}, steps=4, gradient_accumulation_steps=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)  # 65536: fp16 overflows
    trainer, guard, drill = train(
        tmp_path / "fp16", {}, steps=4, scaler=scaler, gradient_accumulation_steps=2, fp16=True
    )
    assert guard.scaler is scaler and not same(drill.before[0], drill.after[3])
    frame, _ = read_run(guard.run_path)
    reference, _ = read_run(plain.run_path)
    assert frame["loss_scale"].tolist() == [1024.0] * 4 and frame["overflow"].sum() == 0
    # the loss with the scale divided out (the Trainer's logged loss)...
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert frame["loss"].tolist() == pytest.approx(logged, rel=1e-3)
    # ...and the gradients unscaled once: the fp32 run's norm at the same first step
    # (not 1/1024 of it: twice; nor 1024 times it: never)
    assert frame["grad_norm"].iloc[0] == pytest.approx(reference["grad_norm"].iloc[0], rel=0.02)
    assert int(scaler._growth_tracker) == 4  # one update per step: the guard's alone


@pytest.mark.filterwarnings("ignore:collapse-guard preflight")
def test_the_guards_numbers_join_the_trainers_log_history_and_its_trackers(tmp_path):
    sent = []
    keywords = {"risk": None, "trackers": lambda metrics, step: sent.append((step, metrics))}
    trainer, guard, _ = train(
        tmp_path, {3: "skip", 5: "checkpoint"}, steps=30, guard=keywords, logging_steps=10
    )
    logs = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    assert sorted(logs) == [10, 20, 30]
    for entry in logs.values():
        assert entry["guard/actions/skip"] == 1.0 and entry["guard/actions/checkpoint"] == 1.0
        assert entry["guard/actions/rescue"] == 0.0 and entry["guard/lr_scale"] > 0
        assert entry["guard/level"] in (0.0, 1.0, 2.0, 3.0)
    # the embedded model scores the windows of steps 9 and 19; each is heard a step later,
    # so the log of step 10 has no risk yet
    readings = guard.run.risk_readings
    assert [step for step, _ in readings] == [9, 19]
    assert "guard/risk" not in logs[10]
    assert [logs[20]["guard/risk"], logs[30]["guard/risk"]] == [p for _, p in readings]
    assert logs[30]["guard/level"] == guard.run.level.rank
    # the trackers get the same numbers at the same steps (the closing summary log of
    # step 30 is not sent twice)
    assert [step for step, _ in sent] == [10, 20, 30]
    assert all(logs[step][k] == v for step, metrics in sent for k, v in metrics.items())


@pytest.mark.slow  # the MLflow store's schema migration: 5-25 s on a shared machine
@pytest.mark.filterwarnings("ignore:collapse-guard preflight")
def test_the_mlflow_run_the_trainers_reporter_logs_to_gets_the_guards_numbers(
    tmp_path, active_store
):
    import mlflow

    mlflow_uri = active_store
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.create_experiment("hf-guarded", artifact_location=tmp_path.as_uri())
    with mlflow.start_run(experiment_id=experiment) as run:  # the reporter logs into it
        train(tmp_path, {3: "skip"}, steps=20, logging_steps=10, report_to=["mlflow"])
    history = {
        name: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        for name in ("loss", "guard/actions/skip")
    }
    assert [step for step, _ in history["loss"]] == [10, 20]  # the Trainer's reporter...
    assert history["guard/actions/skip"] == [(10, 1.0), (20, 1.0)]  # ...and the guard's
