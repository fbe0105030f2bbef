"""Compact run files (the corpus pack): float32 where nothing that matters is lost, read
back as float64; on the corpus's own runs the same numbers to the bit, so the features and
the bundled model's risk are the same to the bit too (tolerance 0)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from collapse_guard.datasets.cli import compact_command
from collapse_guard.predictor import RiskModel
from collapse_guard.runfiles.format import EXACT_SIGNALS, RunMeta
from collapse_guard.runfiles.reader import read_run
from collapse_guard.runfiles.writer import is_compact, write_run
from collapse_guard.signals import SIGNAL_NAMES

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "real"
# three families, three optimizers, bf16 among them (corpus/README.md's card)
CORPUS_RUNS = ("real-s0-00000", "real-s0-00001", "real-s0-00003")


def _types(path: Path) -> dict[str, pa.DataType]:
    return {field.name: field.type for field in pq.read_schema(path)}


@pytest.fixture(scope="module")
def corpus_copies(tmp_path_factory):
    """Each corpus run written float64 and compact: ``[(frame, wide path, compact path)]``."""
    folder = tmp_path_factory.mktemp("compact")
    copies = []
    for name in CORPUS_RUNS:
        frame, meta = read_run(CORPUS / f"{name}.parquet")
        wide = write_run(folder / f"{name}-f64.parquet", frame, meta)
        compact = write_run(folder / f"{name}-f32.parquet", frame, meta, compact=True)
        copies.append((frame, wide, compact))
    return copies


def test_corpus_runs_read_back_the_same_to_the_bit_from_a_third_fewer_bytes(corpus_copies):
    for frame, wide, compact in corpus_copies:
        again, _ = read_run(compact)
        pd.testing.assert_frame_equal(again, frame, check_exact=True)
        assert all(again[name].dtype == np.float64 for name in SIGNAL_NAMES)
        types = _types(compact)
        assert types["lr"] == pa.float64()  # a Python float: float32 would round it
        assert types["loss"] == types["grad_norm"] == types["update_cos"] == pa.float32()
        assert compact.stat().st_size < 0.8 * wide.stat().st_size


def test_features_and_bundled_risk_are_unchanged(corpus_copies):
    model = RiskModel.load()
    for _, wide, compact in corpus_copies:
        risk_wide = model.predict_run(read_run(wide)[0])
        risk_compact = model.predict_run(read_run(compact)[0])
        assert np.array_equal(np.asarray(risk_wide), np.asarray(risk_compact))


def test_exact_signals_stay_float64_when_float32_would_round_them(tmp_path):
    n = 6
    frame = pd.DataFrame(
        {
            "step": np.arange(n),
            "loss": [2.0, 2.1, math.nan, math.inf, 1.5, 1.0],  # 2.1 is not a float32
            "lr": [1e-3] * n,
            "grad_norm": [0.5] * n,  # float32-exact: narrowed, nothing lost
            "update_ratio": [0.1] * n,  # rounded: its exact value does not matter
            "attn_logit_max": [1e300, 2.0, math.nan, -math.inf, 1.0, 0.5],  # would overflow
            "loss_nonfinite": [0, 0, 1, 1, 0, 0],
        }
    )
    path = write_run(tmp_path / "r.parquet", frame, RunMeta("r", "real"), compact=True)
    types = _types(path)
    assert types["loss"] == types["lr"] == types["attn_logit_max"] == pa.float64()
    assert types["grad_norm"] == types["update_ratio"] == types["loss_nonfinite"] == pa.float32()
    again, _ = read_run(path)
    for name in (*EXACT_SIGNALS, "attn_logit_max", "loss_nonfinite"):
        np.testing.assert_array_equal(again[name].to_numpy(), frame[name].to_numpy(float))
    # float32 rounding: within half a unit in the last place, 2**-24 relative
    np.testing.assert_allclose(again["update_ratio"], 0.1, rtol=2**-24, atol=0)
    assert again["update_ratio"].iloc[0] != 0.1


def test_a_float64_file_and_its_compact_copy_read_alike(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"step": np.arange(50), "loss": rng.random(50), "lr": 1e-3})
    frame["grad_cv"] = rng.random(50).astype(np.float32)  # what a probe measures
    meta = RunMeta("r", "real", onset_step=30, label_version="1")
    old = write_run(tmp_path / "a.parquet", frame, meta)
    wide, _ = read_run(old)
    narrow, meta_back = read_run(write_run(tmp_path / "b.parquet", frame, meta, compact=True))
    pd.testing.assert_frame_equal(wide, narrow, check_exact=True)
    assert meta_back.onset_step == 30
    assert _types(old)["grad_cv"] == pa.float64() and _types(old)["loss"] == pa.float64()


def test_data_compact_rewrites_float64_files_in_place_once(tmp_path):
    source = CORPUS / f"{CORPUS_RUNS[0]}.parquet"
    frame, meta = read_run(source)
    wide = write_run(tmp_path / "a.parquet", frame, meta)
    already = write_run(tmp_path / "sub" / "b.parquet", frame, meta, compact=True)
    app = typer.Typer()
    app.command()(compact_command)
    result = CliRunner().invoke(app, [str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "1 of 2 run files rewritten compact" in result.output
    assert is_compact(wide) and is_compact(already)
    pd.testing.assert_frame_equal(read_run(wide)[0], frame, check_exact=True)
    assert read_run(wide)[1] == meta
    assert "0 of 2" in CliRunner().invoke(app, [str(tmp_path)]).output
    missing = CliRunner().invoke(app, [str(tmp_path / "none")])
    assert missing.exit_code == 2 and "no such folder" in missing.output


def test_data_compact_names_a_damaged_file_in_one_line(tmp_path):
    (tmp_path / "cut.parquet").write_bytes(b"PAR1 not a whole file")
    app = typer.Typer()
    app.command()(compact_command)
    result = CliRunner().invoke(app, [str(tmp_path)])
    assert result.exit_code == 2 and "cut.parquet: not a readable Parquet run file" in result.output
    assert "Traceback" not in result.output
