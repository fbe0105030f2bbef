"""Real runs: corpus, config, sampler, faults, one recorded run, the pool and resuming.

Runs here are tiny (a 1-layer, 32-wide model, tens of steps) so the file stays fast;
the pool tests spawn processes, which costs a few seconds of start-up each.
"""

from __future__ import annotations

import math
import operator
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from collapse_guard.datasets.parallel import run_progress, spawn_pool
from collapse_guard.datasets.real import (
    FAULTS,
    PRECISIONS,
    RECIPES,
    Focus,
    RealRunConfig,
    generate_real_runs,
    run_id_for,
    sample_config,
    sample_configs,
)
from collapse_guard.datasets.real.corpus import load_corpus
from collapse_guard.datasets.real.faults import FaultInjector
from collapse_guard.datasets.real.model import GPT, GPTConfig
from collapse_guard.datasets.real.optim import build_optimizer
from collapse_guard.datasets.real.precision import emulate_precision
from collapse_guard.datasets.real.runner import run_real, temp_path
from collapse_guard.datasets.real.sampler import STABLE_EDGE
from collapse_guard.runfiles import RUN_COLUMNS, read_meta, read_run

TINY = {"n_layer": 1, "d_model": 32, "seq_len": 32, "batch_size": 4}


# --------------------------------------------------------------------------- corpus


def test_corpus_is_deterministic_python_source():
    first = load_corpus(200_000)
    load_corpus.cache_clear()
    again = load_corpus(200_000)
    assert len(first) == 200_000
    assert bytes(first) == bytes(again)
    assert b"import " in bytes(first) and b"def " in bytes(first)


# --------------------------------------------------------------------------- config


def test_config_round_trips_and_rejects_unknown_keys():
    config = RealRunConfig(lr=0.05, fault="lr_jump", fault_step=10, fault_scale=5.0)
    assert RealRunConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match=r"unknown RealRunConfig key.*known keys"):
        RealRunConfig.from_dict({"lr": 0.1, "learning_rate": 0.1})
    with pytest.raises(ValueError, match="expected one of"):
        RealRunConfig(fault="meteor")


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    config = RealRunConfig(lr=0.01, warmup_steps=10, steps=110, min_lr_ratio=0.1)
    assert config.lr_at(0) == pytest.approx(0.001)
    assert config.lr_at(9) == pytest.approx(0.01)
    assert config.lr_at(60) == pytest.approx(0.0055)
    assert config.lr_at(110) == pytest.approx(0.001)


def test_rewarming_ramps_to_the_second_peak_then_decays():
    base = {"lr": 0.01, "warmup_steps": 10, "steps": 210, "min_lr_ratio": 0.1}
    plain = RealRunConfig(**base)
    config = RealRunConfig(**base, rewarm_step=110, rewarm_steps=10, rewarm_lr=0.1)
    assert [config.lr_at(s) for s in range(110)] == [plain.lr_at(s) for s in range(110)]
    start = plain.lr_at(110)
    assert config.lr_at(110) == pytest.approx(start + (0.1 - start) / 10)
    assert config.lr_at(119) == pytest.approx(0.1)
    assert config.lr_at(210) == pytest.approx(0.01)


# --------------------------------------------------------------------------- sampler


def test_sampler_mixes_collapse_prone_and_safe_configs_over_every_knob():
    steps = 1000
    configs = sample_configs(300, seed=0, steps=steps)
    assert {c.recipe for c in configs} == set(RECIPES)
    assert {c.fault for c in configs} == set(FAULTS)
    assert {c.precision for c in configs} == set(PRECISIONS)
    for knob in ("qk_norm", "pre_ln"):
        assert {getattr(c, knob) for c in configs} == {True, False}
    for knob in ("n_layer", "d_model", "seq_len", "batch_size", "beta2", "weight_decay"):
        assert len({getattr(c, knob) for c in configs}) >= 2, knob
    assert {c.grad_clip for c in configs} == {0.0, 1.0}
    assert max(c.init_scale for c in configs) >= 2.5
    assert min(c.eps for c in configs) <= 1e-10
    # LR alone must not tell, within an optimizer: high LR comes with qk-norm (safe),
    # and collapse-prone set-ups come at moderate LR (faults, ramps, fragile recipes)
    adamw = [c for c in configs if c.optimizer == "adamw"]
    high = [c for c in adamw if c.lr >= 0.06]
    assert any(c.qk_norm for c in high) and any(not c.qk_norm for c in high)
    prone = ("growing_fault", "slow_ramp", "sudden", "fragile")
    assert sum(c.lr < 0.03 and c.recipe in prone for c in adamw) >= 30
    # triggers lie between 1/5 and 11/20 of the run, so ~300 steps of growth still fit
    triggers = [t for c in configs for t in c.triggers() if t]
    assert min(triggers) >= 0.2 * steps and max(triggers) <= 0.55 * steps
    assert min(triggers) < 0.25 * steps and max(triggers) > 0.5 * steps


def test_sampler_is_stable_per_index():
    assert sample_configs(10, seed=3)[7] == sample_config(3, 7)
    assert sample_configs(5, seed=3) != sample_configs(5, seed=4)
    assert sample_config(0, 1, steps=40).steps == 40


def test_a_focused_sweep_draws_only_its_recipes_and_optimizers_in_their_shares():
    focus = Focus(("constant_high", "slow_ramp"), ("lion", "sgd"))
    configs = sample_configs(110, seed=1, focus=focus)
    recipes = Counter(c.recipe for c in configs)
    optimizers = Counter(c.optimizer for c in configs)
    assert set(recipes) == {"constant_high", "slow_ramp"}
    assert set(optimizers) == {"lion", "sgd"}
    # shares among themselves (0.15 : 0.17, 0.30 : 0.25), stratified: +-1 run
    assert abs(recipes["slow_ramp"] - 110 * 0.17 / 0.32) <= 1.5
    assert abs(optimizers["lion"] - 110 * 0.30 / 0.55) <= 1.5
    assert {c.family for c in configs} == {"gpt", "rope_swiglu", "mha"}
    assert {c.data for c in configs} == {"bytes", "language"}
    # its own ids: it can top up the folder of the full sweep without a clash
    assert run_id_for(1, 7, focus) == "real-s1-constant_high+slow_ramp.lion+sgd-00007"
    assert run_id_for(1, 7, Focus(optimizers=("sgd",))) == "real-s1-all.sgd-00007"
    assert run_id_for(1, 7, Focus()) == run_id_for(1, 7) == "real-s1-00007"
    assert sample_configs(5, seed=1, focus=Focus()) == sample_configs(5, seed=1)


def test_safe_ramps_stay_under_the_edge_and_come_only_from_a_top_up():
    assert "safe_ramp" not in {c.recipe for c in sample_configs(400, seed=0)}
    configs = sample_configs(40, seed=3, focus=Focus(("safe_ramp",)))
    assert {c.recipe for c in configs} == {"safe_ramp"}
    for c in configs:
        edge = STABLE_EDGE[c.family, c.optimizer]
        top = 0.4 if c.optimizer == "sgd" else 0.8  # SGD's measured edge is lower
        # a slow re-warm up, as slow_ramp's, that ends under the edge
        assert c.lr < c.rewarm_lr <= top * edge and 100 <= c.rewarm_steps <= 300
        assert c.rewarm_lr >= 1.5 * c.lr and c.rewarm_step > 0 and c.fault == "none"


# --------------------------------------------------------------------------- faults


def _model_and_optimizer(optimizer: str = "adamw"):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{k: TINY[k] for k in ("n_layer", "d_model", "seq_len")}))
    return model, build_optimizer(RealRunConfig(optimizer=optimizer, lr=1e-3), model)


def test_fault_hooks_touch_only_their_steps():
    model, optimizer = _model_and_optimizer()
    x = torch.zeros(4, 32, dtype=torch.long)
    generator = torch.Generator().manual_seed(0)

    corrupt = FaultInjector(RealRunConfig(fault="corrupt_batch", fault_step=5, fault_steps=2))
    assert corrupt.batch(4, x, x, generator)[0] is x
    noisy, target = corrupt.batch(6, x, x, generator)
    assert noisy.shape == x.shape and noisy.any() and torch.equal(noisy[:, 1:], target[:, :-1])

    jump = FaultInjector(RealRunConfig(fault="lr_jump", fault_step=5, fault_scale=30.0))
    assert [jump.lr_multiplier(s) for s in (4, 5, 500)] == [1.0, 30.0, 30.0]
    # a ramp of 4 steps from x1 to x5: +1 a step from its first step, then held
    ramp = FaultInjector(
        RealRunConfig(fault="lr_ramp", fault_step=5, fault_steps=4, fault_scale=5.0)
    )
    assert [ramp.lr_multiplier(s) for s in (4, 5, 6, 8, 9, 500)] == [1, 2, 3, 5, 5, 5]

    # a share of random tokens rising 0 -> 0.5 over 100 steps: ~0.25 at the middle
    tokens = torch.arange(1, 65).repeat(40, 1) % 256  # never 0; (40, 64)
    share = FaultInjector(
        RealRunConfig(fault="corrupt_ramp", fault_step=10, fault_steps=100, fault_scale=0.5)
    )
    clean, _ = share.batch(9, tokens[:, :-1], tokens[:, 1:], generator)
    assert torch.equal(clean, tokens[:, :-1])
    for step, expected in ((59, 0.25), (400, 0.5)):
        mixed, after = share.batch(step, tokens[:, :-1], tokens[:, 1:], generator)
        assert torch.equal(mixed[:, 1:], after[:, :-1])  # still next-token pairs
        changed = (mixed != tokens[:, :-1]).float().mean().item()
        # a replaced token equals the old one 1 time in 256; 2,520 tokens: +-0.03 is ~3 sd
        assert changed == pytest.approx(expected * 255 / 256, abs=0.03)

    _, loss = model(x, x)
    loss.backward()
    before = [p.grad.clone() for p in model.parameters()]
    spike = FaultInjector(RealRunConfig(fault="grad_spike", fault_step=5, fault_scale=1e3))
    spike.after_backward(4, model)
    spike.after_backward(5, model)
    for grad, old in zip((p.grad for p in model.parameters()), before, strict=True):
        torch.testing.assert_close(grad, old * 1e3)

    optimizer.step()
    reset = FaultInjector(RealRunConfig(fault="opt_reset", fault_step=1))
    reset.before_step(0, optimizer)
    assert all(s["exp_avg_sq"].any() for s in optimizer.state.values())
    reset.before_step(1, optimizer)
    assert not any(s["exp_avg_sq"].any() for s in optimizer.state.values())
    assert all(s["exp_avg"].any() for s in optimizer.state.values())


def test_fp16_emulation_overflows_to_inf():
    layer = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.constant_(layer.weight, 1e5)
    emulate_precision(layer, "fp16")
    assert math.isinf(layer(torch.ones(1, 1)).item())
    bf16 = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.constant_(bf16.weight, 1e5)
    emulate_precision(bf16, "bf16")
    assert math.isfinite(bf16(torch.ones(1, 1)).item())


# --------------------------------------------------------------------------- one run


def test_short_run_writes_a_labelled_real_run_file(tmp_path):
    config = RealRunConfig(steps=60, warmup_steps=5, **TINY)
    result = run_real(config, tmp_path / "r.parquet", "r")
    frame, meta = read_run(result.path)
    assert tuple(frame.columns) == RUN_COLUMNS
    assert frame["step"].tolist() == list(range(60))
    assert meta.source == "real" and meta.run_id == "r"
    assert RealRunConfig.from_dict(meta.config) == config
    assert meta.label_version is not None and meta.onset_step is None
    assert meta.extra["steps_run"] == 60 and "collapse_cause" in meta.extra
    assert frame["loss"].notna().all() and frame["grad_norm"].notna().all()
    # the attention family runs every 50 steps and reaches this model's attention
    assert frame.loc[frame["step"] == 50, "attn_entropy_mean"].notna().all()
    assert not temp_path(result.path).exists()
    # a compact file (the corpus pack): the probe's float32 values in float32, the LR exact
    types = pq.read_schema(result.path)
    assert types.field("lr").type == pa.float64() and types.field("step").type == pa.int64()
    assert {types.field(n).type for n in ("loss", "grad_norm", "attn_kl")} == {pa.float32()}


def test_a_run_records_the_line_group_and_reads_a_given_loss_closure(tmp_path):
    """Data runs record the line group at its recorded period; ``loss_closure`` gives it
    the loss to read (three calls a due step) instead of the probe batch's."""
    from collapse_guard.probe.config import RECORDED_LINE_EVERY

    config = RealRunConfig(steps=2 * RECORDED_LINE_EVERY + 1, warmup_steps=5, **TINY)
    calls: list[int] = []

    def counted(model):
        batch = torch.randint(0, config.vocab_size, (2, config.seq_len + 1))

        def loss():
            calls.append(1)
            return model(batch[:, :-1], batch[:, 1:])[1]

        return loss

    result = run_real(config, tmp_path / "r.parquet", "r", loss_closure=counted)
    frame, _ = read_run(result.path)
    due = frame["step"] % RECORDED_LINE_EVERY == 0
    assert frame.loc[due, "line_edge"].notna().all() and frame.loc[~due, "line_edge"].isna().all()
    assert len(calls) == 3 * int(due.sum()) == 9


def test_lr_jump_gets_an_onset_near_the_jump_and_is_recorded_as_sudden(tmp_path):
    jump_at = 60
    config = RealRunConfig(
        steps=120,
        warmup_steps=10,
        lr=3e-3,
        grad_clip=0.0,
        fault="lr_jump",
        fault_step=jump_at,
        fault_scale=1000.0,
        **TINY,
    )
    result = run_real(config, tmp_path / "jump.parquet", "jump")
    assert result.kind in ("nonfinite", "loss_rise")
    assert jump_at <= result.onset_step <= jump_at + 9  # LR x1000: within a few steps
    assert result.cause == "fault_lr_jump"
    meta = read_meta(result.path)
    assert meta.onset_step == result.onset_step
    assert meta.extra["triggers"] == [0, jump_at]
    assert meta.extra["onset_kind"] == "sudden"
    assert meta.extra["trigger_to_onset"] == result.onset_step - jump_at


@pytest.mark.parametrize(
    ("family", "optimizer", "data", "vocab"),
    [("rope_swiglu", "lion", "language", 64), ("mha", "sgd", "bytes", 256)],
)
def test_other_families_optimizers_and_data_record_a_run(tmp_path, family, optimizer, data, vocab):
    config = RealRunConfig(
        family=family,
        optimizer=optimizer,
        data=data,
        vocab_size=vocab,
        steps=30,
        warmup_steps=5,
        lr={"lion": 1e-3, "sgd": 0.3}[optimizer],
        **TINY,
    )
    result = run_real(config, tmp_path / "r.parquet", "r")
    frame, meta = read_run(result.path)
    assert meta.config["family"] == family and meta.config["optimizer"] == optimizer
    assert meta.config["data"] == data and meta.extra["triggers"] == [0]
    assert meta.extra["onset_kind"] is None and meta.onset_step is None
    assert frame["loss"].iloc[0] == pytest.approx(math.log(vocab), abs=0.6)
    assert frame["loss"].iloc[-5:].mean() < frame["loss"].iloc[:5].mean()
    assert frame["attn_entropy_mean"].notna().any()


# --------------------------------------------------------------------------- pool


def test_generation_resumes_skipping_finished_runs_and_redoing_temp_files(tmp_path):
    paths = generate_real_runs(2, tmp_path, workers=2, seed=5, steps=20, progress=False)
    assert [p.name for p in paths] == [f"{run_id_for(5, i)}.parquet" for i in range(2)]
    stamps = [p.stat().st_mtime_ns for p in paths]

    paths[1].unlink()  # a run killed midway leaves only its temp file
    temp_path(paths[1]).write_bytes(b"half a run")
    again = generate_real_runs(2, tmp_path, workers=1, seed=5, steps=20, progress=False)
    assert again == paths
    assert paths[0].stat().st_mtime_ns == stamps[0]  # finished: skipped
    assert not temp_path(paths[1]).exists()
    frame, meta = read_run(paths[1])
    assert len(frame) == 20 and meta.config == sample_config(5, 1, steps=20).to_dict()


def test_spawn_pool_yields_every_result_of_chunked_tasks_and_the_bar_counts():
    # the shared pool of both generators (real: chunks of 1; synthetic: chunks of 8)
    tasks = [(i, 10) for i in range(5)]
    assert sorted(spawn_pool(operator.add, tasks, 2, chunksize=2)) == [10, 11, 12, 13, 14]
    with run_progress("runs", total=3, done=1, enabled=False) as advance:
        advance()
        advance("healthy 2")


def test_an_interrupted_spawn_pool_stops_its_workers_at_once():
    # every task used to be submitted up front and the pool's exit waited for them all:
    # Ctrl-C froze the bar while the workers went on
    import multiprocessing
    import signal
    import time

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    began = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, 4.0)  # "Ctrl-C" once the workers are busy
    try:
        with pytest.raises(KeyboardInterrupt):
            list(spawn_pool(time.sleep, [(60.0,)] * 6, 2))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.perf_counter() - began < 20  # not the 3 x 60 s of sleeps queued
    assert multiprocessing.active_children() == []  # terminated and waited for


@pytest.mark.slow  # ~20-60 s a signal: two spawned workers import torch and record
@pytest.mark.parametrize(("name", "group"), [("SIGINT", True), ("SIGTERM", False)])
def test_data_real_stops_on_the_first_ctrl_c_or_sigterm_leaving_no_temp_files_or_workers(
    tmp_path, name, group
):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    command = Path(sys.executable).with_name("collapse-guard")
    args = ["data", "real", "--n", "6", "--workers", "2", "--steps", "300", "--out", str(tmp_path)]
    # A child inherits an ignored SIGINT (and Python keeps it ignored, as in a job started
    # with `&`); a framework run by an earlier test can leave it so in this process (seen
    # after tests/clients), so the sweep is started as from a terminal: default Ctrl-C
    sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sweep = subprocess.Popen(
            [str(command), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a process group of its own, as a terminal's job
        )
    finally:
        signal.signal(signal.SIGINT, sigint)
    try:
        deadline = time.monotonic() + 240
        while not list(tmp_path.glob("*.parquet.tmp")) and time.monotonic() < deadline:
            time.sleep(0.2)  # a run is half-recorded: its temp file is on disk
        assert list(tmp_path.glob("*.parquet.tmp")), "no run started in 240 s"
        workers = psutil.Process(sweep.pid).children(recursive=True)
        assert len(workers) >= 2
        stopped_at = time.monotonic()
        number = getattr(signal, name)
        # Ctrl-C in a terminal reaches every process of the job; SIGTERM (kill, a
        # scheduler's stop) the parent alone
        os.killpg(sweep.pid, number) if group else sweep.send_signal(number)
        _, err = sweep.communicate(timeout=60)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    assert time.monotonic() - stopped_at < 15, err
    assert sweep.returncode == {"SIGINT": 130, "SIGTERM": 143}[name], err
    finished = len(list(tmp_path.glob("*.parquet")))
    said = "Ctrl-C" if name == "SIGINT" else name
    assert f"stopped by {said}: {finished} of 6 runs finished in {tmp_path}" in err
    assert "run the same command again to resume" in err and "Traceback" not in err
    assert not list(tmp_path.glob("*.tmp"))
    psutil.wait_procs(workers, timeout=5)
    assert [w.pid for w in workers if w.is_running() and w.status() != "zombie"] == []


@pytest.mark.slow
def test_dask_path_runs_on_a_local_cluster(tmp_path):
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
    ) as cluster:
        paths = generate_real_runs(
            2, tmp_path, seed=1, steps=20, scheduler=cluster.scheduler_address, progress=False
        )
    for path in paths:
        frame, meta = read_run(path)
        assert len(frame) == 20 and meta.source == "real"


# --------------------------------------------------------------------------- command line


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--n", "-3"], "'--n'"),
        (["--n", "2", "--workers", "0"], "'--workers'"),
        (["--n", "2", "--steps", "0"], "'--steps'"),
    ],
)
def test_data_real_refuses_bad_counts_with_exit_code_2(tmp_path, args, names):
    from typer.testing import CliRunner

    from collapse_guard.datasets.cli import app

    result = CliRunner().invoke(app, ["real", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert f"Invalid value for {names}" in result.output
    assert not list(tmp_path.iterdir())  # nothing was started


def test_data_real_names_an_unknown_recipe_and_the_known_ones_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from collapse_guard.datasets.cli import app

    args = ["real", "--n", "2", "--recipes", "slow_ramp,fast_ramp", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown recipes fast_ramp; expected")
    assert "constant_high" in lines[0]
    assert not list(tmp_path.iterdir())  # nothing was started


def test_data_real_names_an_unusable_out_folder_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from collapse_guard.datasets.cli import app

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(app, ["real", "--n", "1", "--out", str(blocker)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {blocker}: cannot make the folder")
