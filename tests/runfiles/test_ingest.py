"""Ingest: new run files from folders and fsspec URLs, checked, labelled, guarded runs censored."""

from __future__ import annotations

import shutil

import fsspec
import numpy as np
import pandas as pd
import pytest

from collapse_guard.runfiles.censoring import censor_guarded, first_intervention
from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.ingest import INGESTED_FOLDER, ingest_runs
from collapse_guard.runfiles.label import HORIZON, LabelRule
from collapse_guard.runfiles.reader import read_meta, read_run
from collapse_guard.runfiles.writer import write_run

TAIL = LabelRule().tail_min_steps


def loss_trace(n: int = 1500, collapse_at: int | None = None, seed: int = 0) -> pd.DataFrame:
    """A falling loss (2.4 nats + a decaying term), stuck at 6 nats from ``collapse_at``."""
    rng = np.random.default_rng(seed)
    steps = np.arange(n)
    loss = 2.4 + 3.0 * np.exp(-steps / 200) + rng.normal(0, 0.02, n)
    if collapse_at is not None:
        loss[collapse_at:] = 6.0 + rng.normal(0, 0.02, n - collapse_at)
    # the guard checkpoints every 100 steps: not an intervention
    events = ["checkpoint" if s % 100 == 0 else "" for s in steps]
    return pd.DataFrame({"step": steps, "loss": loss, "event": events})


def guarded(run_id: str, frame: pd.DataFrame, closed: bool = True) -> RunMeta:
    extra = {"guard": {"steps": len(frame)}} if closed else {}
    return RunMeta(run_id=run_id, source="guarded", extra=extra)


def intervene(frame: pd.DataFrame, step: int, event: str) -> pd.DataFrame:
    frame = frame.copy()
    frame.loc[frame["step"] == step, "event"] = event
    return frame


def test_an_averted_collapse_is_censored_never_healthy():
    # the guard lowers the LR at step 900 and the run then trains on: rows whose horizon
    # reaches past 900 - tail steps have no known outcome and are dropped
    frame = intervene(loss_trace(), 900, "lr_x0.5;checkpoint")
    assert first_intervention(frame) == 900
    kept, meta, censoring = censor_guarded(frame, guarded("g", frame))
    assert censoring.kept_until == 900 - TAIL - HORIZON - 1 == 649
    assert kept["step"].max() == 649 and len(kept) == 650
    assert meta.onset_step is None and meta.label_version is not None
    assert meta.extra["censoring"]["first_intervention"] == 900


def test_a_collapse_under_way_before_the_guard_acted_is_kept():
    # loss stuck from step 1000; the guard's first skip comes at 1005 and does not save it
    frame = intervene(loss_trace(collapse_at=1000), 1005, "skip:nonfinite_grad")
    kept, meta, censoring = censor_guarded(frame, guarded("g", frame))
    assert meta.onset_step == 1000
    assert kept["step"].max() == 1004 and censoring.first_intervention == 1005


def test_a_run_the_guard_never_touched_is_labelled_whole():
    frame = loss_trace(collapse_at=1200)
    kept, meta, censoring = censor_guarded(frame, guarded("g", frame))
    assert censoring.first_intervention is None and not censoring.censored
    assert len(kept) == len(frame) and meta.onset_step == 1200


@pytest.fixture
def memory_runs(new_paths):
    """Four valid runs, a damaged one, a truncated one and a note under memory://fleet."""
    fs = fsspec.filesystem("memory")
    for path in new_paths[:4]:
        fs.put(str(path), f"memory://fleet/a/{path.name}")
    fs.pipe("memory://fleet/junk.parquet", b"not a parquet file")
    fs.pipe("memory://fleet/cut.parquet", new_paths[4].read_bytes()[:-300])
    fs.pipe("memory://fleet/notes.txt", b"hello")
    yield "memory://fleet"
    fs.rm("memory://fleet", recursive=True)


def test_memory_url_ingests_valid_runs_and_names_every_invalid_file(tmp_path, memory_runs):
    report = ingest_runs([memory_runs], tmp_path)
    assert [i.run_id for i in report.ingested] == [f"synth-s12-{i:06d}" for i in range(4)]
    rejected = {r.name.rsplit("/", 1)[1]: r.reason for r in report.rejected}
    assert sorted(rejected) == ["cut.parquet", "junk.parquet"]
    assert "is not a run file (Parquet written by collapse-guard)" in rejected["junk.parquet"]
    assert "not a readable Parquet run file" in rejected["cut.parquet"]  # damaged: regenerate
    # the reason names the file the user gave, not the staging copy
    assert "memory://" in rejected["junk.parquet"]
    assert [n.rsplit("/", 1)[1] for n in report.ignored] == ["notes.txt"]
    copies = sorted((tmp_path / INGESTED_FOLDER).glob("*.parquet"))
    assert len(copies) == 4
    meta = read_meta(copies[0])
    assert meta.extra["ingest"]["source"].startswith("memory://")
    assert len(meta.extra["ingest"]["sha256"]) == 64


def test_ingest_again_finds_the_runs_and_writes_nothing(tmp_path, memory_runs):
    ingest_runs([memory_runs], tmp_path)
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / INGESTED_FOLDER).iterdir()}
    again = ingest_runs([memory_runs], tmp_path)
    assert again.ingested == [] and len(again.already) == 4
    assert again.run_ids == [f"synth-s12-{i:06d}" for i in range(4)]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / INGESTED_FOLDER).iterdir()} == stamps


def test_file_url_and_plain_paths(tmp_path, new_paths):
    folder = tmp_path / "from_fleet"
    folder.mkdir()
    for path in new_paths[:2]:
        shutil.copy(path, folder / path.name)
    report = ingest_runs([folder.as_uri(), str(new_paths[2]), tmp_path / "absent"], tmp_path / "d")
    assert len(report.ingested) == 3
    assert [r.name for r in report.rejected] == [str(tmp_path / "absent")]
    assert "no such file or folder" in report.rejected[0].reason


def test_the_dataset_folder_itself_is_already_there(base):
    # a run put in the dataset by hand (no ingest record) is recognised by its bytes
    report = ingest_runs([base], base)
    assert len(report.already) == 60 and report.ingested == [] and report.rejected == []


def test_a_run_id_already_there_with_other_data_is_rejected(tmp_path, new_paths):
    ingest_runs([new_paths[0]], tmp_path / "d")
    frame, meta = read_run(new_paths[0])
    other = write_run(tmp_path / "other.parquet", frame.iloc[:-10], meta)
    report = ingest_runs([other], tmp_path / "d")
    assert report.ingested == [] and report.already == []
    assert meta.run_id in report.rejected[0].reason and "other data" in report.rejected[0].reason


def test_guarded_runs_unclosed_rejected_closed_censored(tmp_path):
    source = tmp_path / "guard"
    averted = intervene(loss_trace(), 900, "lr_x0.5")
    write_run(source / "averted.parquet", averted, guarded("averted", averted))
    caught = intervene(loss_trace(collapse_at=1000), 1030, "rescue:online_collapse")
    write_run(source / "caught.parquet", caught, guarded("caught", caught))
    write_run(source / "open.parquet", averted, guarded("open", averted, closed=False))
    unlabelled = loss_trace(collapse_at=1200)
    write_run(source / "plain.parquet", unlabelled, RunMeta(run_id="plain", source="real"))
    report = ingest_runs([source], tmp_path / "d")
    assert {i.run_id for i in report.ingested} == {"averted", "caught", "plain"}
    assert [r.name for r in report.rejected] == [str(source / "open.parquet")]
    assert "guard.close()" in report.rejected[0].reason
    by_id = {i.run_id: i for i in report.ingested}
    assert by_id["averted"].censoring.kept_until == 649
    frame, meta = read_run(by_id["averted"].path)
    assert frame["step"].max() == 649 and meta.onset_step is None
    # a rescue is a caught collapse: the rows up to it, labelled from the excursion it saw
    assert by_id["caught"].censoring.rescue == 1030
    frame, meta = read_run(by_id["caught"].path)
    assert len(frame) == 1031 and meta.onset_step == 1000
    # an unlabelled run from elsewhere is labelled on ingest
    _, plain = read_run(by_id["plain"].path)
    assert plain.onset_step == 1200 and plain.label_version is not None
