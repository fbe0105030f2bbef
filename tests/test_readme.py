"""The README's Python examples run as written, and its commands parse as written."""

import math
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest
from typer.core import TyperGroup
from typer.main import get_command
from typer.testing import CliRunner

from collapse_guard.cli import app

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_the_probe_and_predictor_examples():
    blocks = _python_blocks()
    assert len(blocks) == 2
    assert "Probe(model, optimizer)" in blocks[0]
    assert "RiskModel.load()" in blocks[1]


def test_probe_example_runs_and_records_finite_signals(capsys):
    namespace: dict = {}
    exec(compile(_python_blocks()[0], "README.md", "exec"), namespace)
    record = namespace["record"]
    assert math.isfinite(record["loss"]) and record["loss"] > 0
    assert math.isfinite(record["grad_norm"])
    printed = capsys.readouterr().out.split()
    assert len(printed) == 3


def test_predictor_example_scores_every_step():
    steps = range(300)
    frame = pd.DataFrame({"step": steps, "loss": [3.0 - 0.002 * s for s in steps]})
    namespace = {"frame": frame}
    exec(compile(_python_blocks()[1], "README.md", "exec"), namespace)
    risk = namespace["risk"]
    assert len(risk) == len(frame)
    assert ((risk >= 0) & (risk <= 1)).all()
    assert set(namespace["model"].thresholds) == {"watch", "warn", "critical"}


# ------------------------------------------------- the README's commands, as written

_OPTIONAL = re.compile(r"\s*\[([^\]]*)\]")


def _command_lines() -> list[str]:
    """Every ``collapse-guard ...`` line of the README's bash blocks, comments cut."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL)
    lines = (line.split("  #")[0].strip() for b in blocks for line in b.splitlines())
    return [line for line in lines if line.startswith("collapse-guard ")]


def _forms(line: str) -> list[list[str]]:
    """The line without its [optional] parts, and with all of them (first alternative of
    ``a|b``, a one-letter placeholder as 1)."""
    bare = _OPTIONAL.sub("", line)
    full = _OPTIONAL.sub(lambda m: " " + m.group(1).split("|")[0], line)
    full = re.sub(r"(?<= )[A-Z](?= |$)", "1", full)
    return [shlex.split(bare)[1:], shlex.split(full)[1:]]


def _parse(args: list[str]):
    """The click context the command line builds for ``args`` (parsed and converted,
    through the top-level group's own resolution), without running the command."""
    command, ctx, name = get_command(app), None, "collapse-guard"
    while isinstance(command, TyperGroup):
        ctx = command.make_context(name, [], parent=ctx, resilient_parsing=True)
        name, command, args = command.resolve_command(ctx, args)
    return command.make_context(name, args, parent=ctx)


def test_readme_lists_the_commands():
    names = {shlex.split(line)[1] for line in _command_lines()}
    assert {"data", "train", "evaluate", "predict", "serve"} <= names


def test_every_readme_command_parses_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for line in _command_lines():  # the files the lines name, where a command checks them
        for token in shlex.split(line):
            if token.endswith(".parquet"):
                (tmp_path / token).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / token).touch()
    for line in _command_lines():
        for args in _forms(line):
            _parse(args)  # raises click's usage error on an option or value it refuses


def test_readme_runs_form_gives_every_folder():
    """`--runs a b` (the README's form) and `--runs a --runs b` mean the same."""
    (train,) = [line for line in _command_lines() if line.startswith("collapse-guard train")]
    runs = _parse(_forms(train)[0]).params["runs"]
    assert [str(p) for p in runs] == ["data/real", "data/synth"]
    repeated = ["train", "--runs", "data/real", "--runs", "data/synth", "--seed", "3"]
    assert _parse(repeated).params["runs"] == runs


@pytest.mark.slow
def test_readme_train_evaluate_predict_run_as_written(tmp_path, monkeypatch):
    """train, evaluate and predict as the README writes them, on short synthetic runs in
    data/real and data/synth, with the README's store (./mlruns/mlflow.db)."""
    from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs
    from collapse_guard.datasets.synthetic.sampler import SamplerConfig

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    short = SamplerConfig(min_steps=600, max_steps=1200)
    generate_synthetic_runs(12, "data/synth", seed=21, config=short)
    real = generate_synthetic_runs(12, "data/real", seed=22, config=short)
    real[3].rename("data/real/real-s0-00003.parquet")  # the file the README predicts on
    lines = {shlex.split(line)[1]: line for line in _command_lines()}

    def run(args: list[str]) -> str:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        return " ".join(result.output.split())

    assert "now champion" in run(_forms(lines["train"])[0])
    # with its options: --model models:/collapse-predictor@champion --unseen-only
    evaluate = _forms(next(line for line in _command_lines() if "--unseen-only" in line))[1]
    assert "runs it never saw" in run(evaluate)
    assert "plot written to risk.png" in run(_forms(lines["predict"])[0])
    assert Path("risk.png").stat().st_size > 10_000
    # the champion by its short name: the registered version, not the bundled model
    predict = _forms(lines["predict"])[0][:2]
    assert run([*predict, "--model", "@champion"]).endswith("model 1")
