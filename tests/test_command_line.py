"""The ``collapse-guard`` command: every sub-command mounted, a fast start, a working demo,
and bad input as one line with exit code 2 from every command (a bug keeps its traceback)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from collapse_guard.cli import ErrorHandlingGroup, app
from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs
from collapse_guard.datasets.synthetic.sampler import SamplerConfig

# Heavy dependencies that only a command's own run may import (docs/design.md, "Layout").
_HEAVY = ("torch", "mlflow", "lightgbm", "bentoml")


def _command() -> Path:
    # the console script installed beside this interpreter (.venv/bin/collapse-guard)
    return Path(sys.executable).with_name("collapse-guard")


def test_help_lists_every_command():
    result = subprocess.run(
        [str(_command()), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    for name in ("data", "train", "evaluate", "predict", "demo"):
        assert f" {name} " in result.stdout, f"{name!r} missing from:\n{result.stdout}"


def test_importing_the_cli_leaves_heavy_dependencies_out():
    code = (
        "import sys, collapse_guard.cli; "
        f"print(','.join(m for m in {_HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "", f"imported at start-up: {result.stdout.strip()}"


def test_demo_trains_both_runs_prints_the_table_and_writes_the_plot(tmp_path):
    args = ["demo", "--steps", "40", "--rewarm-at", "20", "--rewarm-steps", "10"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # table rows: cells between box bars (ASCII "|" where the terminal has no Unicode)
    cells = [
        [c.strip() for c in re.split(r"[│┃|]", line.strip())[1:-1]]
        for line in result.output.splitlines()
    ]
    rows = {c[0]: c for c in cells if c and c[0] in ("unguarded", "guarded")}
    assert set(rows) == {"unguarded", "guarded"}
    for row in rows.values():
        assert math.isfinite(float(row[1])) and float(row[1]) > 0  # final loss
        assert float(row[-1]) > 0  # wall seconds
    assert "checkpoint" in rows["guarded"][4]  # its first healthy step wrote one
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert len(list((tmp_path / "guarded").glob("run-*.parquet"))) == 1


# ---------------------------------------------------------------- bad input: one line

_SHORT = SamplerConfig(min_steps=600, max_steps=1200)  # short runs: seconds to make


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    """Four short labelled synthetic runs."""
    folder = tmp_path_factory.mktemp("runs")
    generate_synthetic_runs(4, folder, seed=3, config=_SHORT)
    return folder


@pytest.fixture
def damaged_runs(runs_dir, tmp_path) -> tuple[Path, Path]:
    """(folder, damaged file): the four runs and a copy of one cut to its first 3 KB."""
    folder = tmp_path / "runs"
    folder.mkdir()
    for path in runs_dir.glob("*.parquet"):
        (folder / path.name).write_bytes(path.read_bytes())
    damaged = folder / "cut.parquet"
    damaged.write_bytes(next(runs_dir.glob("*.parquet")).read_bytes()[:3000])
    return folder, damaged


@pytest.fixture
def store_env(tmp_path, monkeypatch) -> Path:
    """A tracking store of this test's own (never ./mlruns), and the folder it would be in."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "store"


def _one_line_error(args: list[str], *words: str) -> str:
    """Run the command; assert exit code 2 and one ``error:`` line naming ``words``."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    # exit(2), not an exception caught by the runner (which would be a traceback)
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


_NOT_A_RUN_FILE = "is not a run file (Parquet written by collapse-guard)"
_PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)  # the signature of every PNG file, then anything


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("risk.png", _PNG),
        ("wrong.csv", b"step,loss\n0,2.5\n1,2.4\n"),
        ("hostname", b"build-7\n"),
        ("empty.parquet", b""),
    ],
)
def test_predict_on_a_file_that_is_no_parquet_says_what_it_is_not(tmp_path, name, content):
    """Not a damaged run file (which would be regenerated) but no run file at all: a CSV log
    is imported, not regenerated."""
    path = tmp_path / name
    path.write_bytes(content)
    line = _one_line_error(
        ["predict", str(path)], f"{path} {_NOT_A_RUN_FILE}", "`collapse-guard data import`"
    )
    assert "regenerate" not in line and ("empty" in line) == (not content)


def test_predict_on_a_truncated_run_file_keeps_the_damaged_message(damaged_runs):
    _, damaged = damaged_runs
    line = _one_line_error(["predict", str(damaged)], str(damaged), "not a readable Parquet")
    assert "truncated or damaged: delete it and regenerate the run" in line
    assert _NOT_A_RUN_FILE not in line


def test_predict_on_a_foreign_parquet_file_is_one_line(tmp_path):
    foreign = tmp_path / "table.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), foreign)
    _one_line_error(
        ["predict", str(foreign)], str(foreign), "not a collapse-guard run file", "data import"
    )


def test_evaluate_with_a_truncated_run_file_is_one_line(damaged_runs):
    folder, damaged = damaged_runs
    _one_line_error(["evaluate", "--runs", str(folder)], str(damaged), "truncated")


def test_train_with_a_truncated_run_file_is_one_line(damaged_runs, store_env):
    folder, damaged = damaged_runs
    _one_line_error(["train", "--runs", str(folder)], str(damaged), "truncated")


@pytest.mark.parametrize("content", [None, "no log here\n"], ids=["empty", "unknown-format"])
def test_data_import_of_a_folder_without_logs_is_an_error(tmp_path, content):
    logs = tmp_path / "logs"
    logs.mkdir()
    if content is not None:
        (logs / "notes.txt").write_text(content)
    line = _one_line_error(
        ["data", "import", str(logs), "--out", str(tmp_path / "out")],
        f"nothing to import from {logs}",
        "recognised",
    )
    # each importer's own description: the list names every format
    for name in ("algoperf", "nanogpt", "megatron", "tabular", "measurements.csv"):
        assert name in line
    assert not list((tmp_path / "out").glob("*.parquet"))


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["synth", "--n", "0"], "--n"),
        (["synth", "--n", "-2"], "--n"),
        (["synth", "--n", "2", "--seed", "-1"], "--seed"),
        (["real", "--n", "0"], "--n"),
        (["real", "--n", "2", "--seed", "-1"], "--seed"),
    ],
)
def test_data_commands_refuse_nonsensical_counts_and_seeds(tmp_path, args, option):
    """Zero runs is a mistake, not a job; a negative seed crashed numpy's generator."""
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["data", *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output and "Traceback" not in result.output
    assert not out.exists()  # nothing was started


def test_debug_shows_the_traceback_instead(tmp_path):
    """The same input error as in the test above, with --debug: the full traceback."""
    done = subprocess.run(
        [str(_command()), "--debug", "data", "import", str(tmp_path), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "UserInputError" in done.stderr
    assert "nothing to import" in done.stderr


def test_a_bug_keeps_its_traceback():
    """Only input errors become one line: any other exception is a bug, shown in full."""
    broken = typer.Typer(cls=ErrorHandlingGroup)

    @broken.command()
    def divide(n: int) -> None:
        print(1 / n)

    @broken.command()
    def other() -> None:  # a group of two: `divide` stays a sub-command
        pass

    result = CliRunner().invoke(broken, ["divide", "0"])
    assert result.exit_code == 1 and isinstance(result.exception, ZeroDivisionError)


def _serve_error(args: list[str], cwd: Path, env: dict | None = None) -> str:
    """``collapse-guard serve ARGS``, in a process of its own (serve would exec bentoml in
    pytest's): exit code 2 and one line on stderr, returned."""
    done = subprocess.run(
        [str(_command()), "serve", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_serve_refuses_a_missing_tracking_store(tmp_path):
    """No ./mlruns here: an error naming the store, and no empty database made."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    line = _serve_error(["--model", "@champion"], tmp_path, env)
    assert "no MLflow tracking store" in line
    assert str(tmp_path / "mlruns" / "mlflow.db") in line
    assert not (tmp_path / "mlruns").exists()


def test_serve_says_a_model_folder_that_does_not_exist_does_not_exist(tmp_path):
    from support import free_port

    line = _serve_error(["--model", "models/nonexistent", "--port", str(free_port())], tmp_path)
    assert line.startswith("error: --model models/nonexistent: models/nonexistent does not exist")
    assert "collapse-guard calibrate --out" in line


# ---------------------------------------------------------------- --model and the store


def test_model_shorthands_name_the_registry(tmp_path, monkeypatch):
    from collapse_guard.predictor.core.model_source import resolve_model_source

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlruns").mkdir()
    (tmp_path / "mlruns" / "mlflow.db").touch()  # a store is there: its file is enough here
    assert resolve_model_source(None) is None and resolve_model_source("default") is None
    champion = "models:/collapse-predictor@champion"
    assert resolve_model_source("champion") == resolve_model_source("@champion") == champion
    assert resolve_model_source("@staging") == "models:/collapse-predictor@staging"
    assert resolve_model_source("models:/collapse-predictor/2") == "models:/collapse-predictor/2"
    (tmp_path / "champion").mkdir()  # a folder of that name is what the user meant
    assert resolve_model_source("champion") == "champion"


def test_a_registry_model_needs_an_existing_store(tmp_path, monkeypatch):
    from collapse_guard.errors import UserInputError
    from collapse_guard.predictor.core.model_source import resolve_model_source

    monkeypatch.chdir(tmp_path)
    database = tmp_path / "elsewhere" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{database}")
    with pytest.raises(UserInputError, match=f"MLFLOW_TRACKING_URI=sqlite:///{database}"):
        resolve_model_source("@champion")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with pytest.raises(UserInputError, match=r"\./mlruns/mlflow\.db does not exist"):
        resolve_model_source("runs:/0123/risk_model")
    assert not database.parent.exists() and not (tmp_path / "mlruns").exists()
    assert resolve_model_source(str(tmp_path)) == str(tmp_path)  # a folder needs no store


# ------------------------------------------- the predictor's commands: train, evaluate, predict


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("nosuch", ["--model nosuch", "not a model folder", "--model takes"]),
        ("@champion", ["--model @champion", "no MLflow tracking store"]),
        ("champion", ["--model champion", "no MLflow tracking store"]),
    ],
)
@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_a_wrong_model_is_one_line(runs_dir, tmp_path, monkeypatch, command, model, words):
    monkeypatch.chdir(tmp_path)  # no ./mlruns here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = next(runs_dir.glob("*.parquet"))
    args = [command, str(run)] if command == "predict" else [command, "--runs", str(runs_dir)]
    _one_line_error([*args, "--model", model], *words)
    assert not (tmp_path / "mlruns").exists()  # no empty store made


def test_a_damaged_model_folder_is_one_line(runs_dir, tmp_path):
    from collapse_guard.predictor.core.risk import DEFAULT_MODEL_DIR

    folder = tmp_path / "model"
    folder.mkdir()
    for path in DEFAULT_MODEL_DIR.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "model.txt").write_text("tree\nversion=v4\nnot a booster\n")
    run = next(runs_dir.glob("*.parquet"))
    _one_line_error(["predict", str(run), "--model", str(folder)], f"--model {folder}")


def test_train_on_too_few_runs_is_one_line(runs_dir, store_env):
    """Four runs cannot fill a training, a validation and a test split: said before any fit."""
    line = _one_line_error(["train", "--runs", str(runs_dir)], "too few runs")
    assert "collapse-guard data synth" in line
    assert not store_env.exists()  # refused before the store is touched


def test_predict_labels_a_guarded_run_as_training_reads_it(runs_dir, tmp_path):
    """A guarded run's file carries no onset; predict labels it as training does (on the
    steps before the guard's first intervention: here it never acted, so on all of them)."""
    from collapse_guard.runfiles import RunMeta, read_run, write_run

    original = next(p for p in sorted(runs_dir.glob("*.parquet")) if read_run(p)[1].onset_step)
    frame, meta = read_run(original)
    path = write_run(tmp_path / "guarded.parquet", frame, RunMeta(run_id="g1", source="guarded"))
    result = CliRunner().invoke(app, ["predict", str(path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"onset: {meta.onset_step};" in text and "not labelled" not in text
    assert "the run file carries no onset: labelled now by label rule" in text


def test_predict_on_a_run_without_a_loss_says_it_is_not_labelled(tmp_path):
    from collapse_guard.runfiles import RunMeta, RunWriter

    path = tmp_path / "no-loss.parquet"
    with RunWriter(path, RunMeta("no-loss", "imported")) as writer:
        for step in range(80):
            writer.append(step, {"grad_norm": 1.0})
    result = CliRunner().invoke(app, ["predict", str(path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "onset: not labelled (the run records no loss to label it by" in text
    assert "healthy" not in text and "labelled now" not in text


def test_a_retrain_that_fails_after_its_ingest_still_names_the_files_it_skipped(
    damaged_runs, store_env
):
    # four runs are too few to retrain on: the retrain fails after the ingest accepted them
    # and skipped the damaged file; the user learns of both before fixing either
    folder, damaged = damaged_runs
    args = ["retrain", "--runs", str(folder), "--base", str(store_env.parent / "base")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"skipped {damaged}: " in " ".join(result.stdout.split())
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.stderr


def test_predict_plot_into_a_missing_folder_is_one_line_and_makes_no_folder(runs_dir, tmp_path):
    run = next(runs_dir.glob("*.parquet"))
    plot = tmp_path / "nonexistent" / "dir" / "x.png"
    _one_line_error(["predict", str(run), "--plot", str(plot)], f"{plot.parent} does not exist")
    assert not (tmp_path / "nonexistent").exists()


def test_commands_run_wide_off_a_terminal_without_mlflow_bars_and_restore_the_env(
    runs_dir, tmp_path, monkeypatch
):
    for name in ("COLUMNS", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)  # absent, and put back as it was after the test
    seen = {}
    probe = typer.Typer(cls=ErrorHandlingGroup)

    @probe.command()
    def env() -> None:
        seen.update(
            {k: os.environ.get(k) for k in ("COLUMNS", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")}
        )

    @probe.command()
    def other() -> None:  # a group of two: `env` stays a sub-command
        pass

    assert CliRunner().invoke(probe, ["env"]).exit_code == 0
    # rich's default off a terminal is 80 columns; MLflow's download bars filled the output
    assert seen == {"COLUMNS": "200", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    assert "COLUMNS" not in os.environ  # the command's settings do not outlive it
    monkeypatch.setenv("COLUMNS", "100")  # the user's own setting wins
    CliRunner().invoke(probe, ["env"])
    assert seen["COLUMNS"] == "100"
    # a real command: predict's note on an unlabelled run, labelled now (~150 characters),
    # is one line, not wrapped
    from collapse_guard.runfiles import RunMeta, read_run, write_run

    frame, _ = read_run(next(runs_dir.glob("*.parquet")))
    path = write_run(tmp_path / "guarded.parquet", frame, RunMeta(run_id="g1", source="guarded"))
    monkeypatch.delenv("COLUMNS")
    result = CliRunner().invoke(app, ["predict", str(path)])
    (note,) = [x for x in result.output.splitlines() if x.startswith("the run file carries")]
    assert len(note) > 80 and note.endswith("label their runs with)"), result.output


def test_what_the_readmes_commands_write_is_git_ignored():
    # `collapse-guard demo` writes guard-demo/, the README's predict writes risk.png
    root = Path(__file__).resolve().parents[1]
    paths = ["guard-demo/demo.png", "guard-demo/guarded/run-1.parquet", "risk.png"]
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.split() == paths, done.stderr


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("command", "option"),
    [(["data", "real", "--n", "2", "--steps", "5"], "--scheduler"), (["train"], "--dask")],
)
def test_a_dask_scheduler_that_is_not_there_is_one_line_within_seconds(
    runs_dir, store_env, command, option
):
    import time

    import distributed  # noqa: F401  (imported before the clock starts: seconds on its own)

    from collapse_guard._scheduler import CONNECT_TIMEOUT_S

    address = f"tcp://127.0.0.1:{_closed_port()}"
    where = ["--out", str(store_env.parent / "real")] if command[0] == "data" else []
    runs = ["--runs", str(runs_dir)] if command[0] == "train" else []
    began = time.perf_counter()
    line = _one_line_error(
        [*command, *where, *runs, option, address], f"{option} {address}", "no Dask scheduler"
    )
    # distributed's own default waited 30 s, then printed ~190 lines of traceback
    assert time.perf_counter() - began < CONNECT_TIMEOUT_S + 15, line


def test_calibrate_on_an_empty_folder_points_to_the_probe(tmp_path):
    line = _one_line_error(
        ["calibrate", "--runs", str(tmp_path), "--out", str(tmp_path / "m")],
        f"no runs found under {tmp_path}",
        "Probe(model, optimizer).record_to",
    )
    assert "data synth" not in line
