"""The README's Python examples run as written."""

import math
import re
from pathlib import Path

import pandas as pd

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
