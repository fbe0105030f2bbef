"""The run file is durable at the checkpoint cadence, and a resumed run's lineage is on
disk before its first close (the in-process half of test_guard_kill.py)."""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path

import pytest
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard
from collapse_guard.runfiles import read_meta, read_run

EVERY_STEP = {"checkpoint_every": 1, "healthy_quiet_steps": 0}


def _steps(guard, model, opt, n, seed=0):
    loop = Loop(seed=seed)
    for _ in range(n):
        guard.step(loop.loss(model))
        opt.zero_grad()


def test_every_checkpoint_makes_the_rows_up_to_it_durable(tmp_path):
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off", policy=EVERY_STEP)
    _steps(guard, model, opt, 30)  # far fewer than the writer's 256-row chunk
    # not closed: what a SIGKILL now would leave on disk
    frame = read_run(guard.run_path)[0]
    assert frame["step"].tolist() == list(range(30))
    assert guard.ring.newest().name == "guard-000000030.pt"  # the state after step 29
    guard.close()


def test_a_resumed_runs_lineage_is_on_disk_from_its_first_chunk(tmp_path):
    model, opt = tiny_model()
    first = Guard(model, opt, tmp_path, risk="off", policy=EVERY_STEP)
    _steps(first, model, opt, 12)  # killed here: never closed
    model, opt = tiny_model(seed=3)
    second = Guard(model, opt, tmp_path, risk="off", policy=EVERY_STEP)
    assert second.resume() == 12
    _steps(second, model, opt, 3, seed=1)  # killed midway as well
    meta = read_meta(second.run_path)
    assert meta.extra["continues"] == {
        "run_id": first.run_id,
        "step": 12,
        "checkpoint": "guard-000000012.pt",
    }
    assert read_run(first.run_path)[0]["step"].tolist() == list(range(12))  # it names a file
    assert read_run(second.run_path)[0]["step"].tolist() == [12, 13, 14]
    second.close()
    first.close()


# issue 31, case 7: a full disk. The folder gets a byte budget: a write whose file would
# take the folder past it fails at its fsync with ENOSPC, as a full tmpfs does (Linux:
# the fd's path from /proc), and the write's temp file is removed, as the writers do.

FULL = {"checkpoint_every": 5, "healthy_quiet_steps": 0}


class FullDisk:
    """``os.fsync`` of a file under ``folder`` fails with ENOSPC while ``full`` and the
    folder holds more than ``budget`` bytes (``only``: just the files whose name has it)."""

    def __init__(self, monkeypatch, folder, only=""):
        self.folder, self.only, self.full, self.refused = Path(folder), only, False, 0
        self.budget, real = 0, os.fsync

        def fsync(fd):
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if self.full and path.is_file() and self.folder in path.parents:
                used = sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())
                if self.only in path.name and used > self.budget:
                    self.refused += 1
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def fill(self):
        self.full = True
        self.budget = sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())

    def free(self):
        self.full = False


def _said(caught, text):
    return [str(w.message) for w in caught if text in str(w.message)]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="the fd's path from /proc")
def test_a_full_disk_never_stops_training_and_the_run_file_keeps_every_row(tmp_path, monkeypatch):
    disk = FullDisk(monkeypatch, tmp_path)
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off", policy=FULL)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _steps(guard, model, opt, 10)
        durable = int(guard.ring.newest().name[6:15])  # the rows before it are on disk
        disk.fill()
        _steps(guard, model, opt, 30, seed=1)  # 6 checkpoints due, none fits
        on_disk = read_run(guard.run_path)[0]["step"].tolist()
        disk.free()
        _steps(guard, model, opt, 10, seed=2)
        guard.close()
    # each of the 6 checkpoints due tried the run file first, and was not written without it
    assert disk.refused == 6
    assert on_disk == list(range(durable))  # what the disk took before it filled
    run_file = _said(caught, "could not write the run file")
    checkpoint = _said(caught, "could not write checkpoint")
    assert len(run_file) == 1 and len(checkpoint) == 1, [str(w.message) for w in caught]
    assert str(guard.run_path) in run_file[0] and "[Errno 28]" in run_file[0]
    assert f"steps {durable}-{durable + 4}" in run_file[0] and "kept in memory" in run_file[0]
    assert f"guard-0000000{durable + 5}.pt" in checkpoint[0] and str(tmp_path) in checkpoint[0]
    # room again: every row the writer accepted is in the file, and checkpoints go on
    frame, meta = read_run(guard.run_path)
    assert frame["step"].tolist() == list(range(50)) and meta.extra["guard"]["steps"] == 50
    assert int(guard.ring.newest().name[6:15]) > 40  # written again once there was room
    assert not list(tmp_path.glob(".*.tmp*"))  # the refused writes left nothing behind


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="the fd's path from /proc")
def test_a_disk_still_full_at_close_names_the_rows_lost(tmp_path, monkeypatch):
    disk = FullDisk(monkeypatch, tmp_path)
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off", policy=FULL)
    _steps(guard, model, opt, 10)
    guard._writer.flush()  # rows 0-9 on disk
    disk.fill()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _steps(guard, model, opt, 7, seed=1)
        guard.close()  # raises nothing
    lost = _said(caught, "could not be written at close")
    assert len(lost) == 1 and "7 row(s) not on disk (steps 10-16) are lost" in lost[0]
    assert guard._writer.rows_lost == 7
    assert read_run(guard.run_path)[0]["step"].tolist() == list(range(10))
    disk.free()
    guard._writer.close()  # room again: a second close writes them
    assert read_run(guard.run_path)[0]["step"].tolist() == list(range(17))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="the fd's path from /proc")
def test_a_checkpoint_the_disk_refuses_is_said_once_and_training_goes_on(tmp_path, monkeypatch):
    disk = FullDisk(monkeypatch, tmp_path, only=".guard-")  # checkpoints' temp files only
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off", policy=FULL)
    _steps(guard, model, opt, 3)
    disk.fill()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _steps(guard, model, opt, 20, seed=1)
    said = _said(caught, "could not write checkpoint")
    assert len(said) == 1 and "[Errno 28] No space left on device" in said[0]
    assert guard.step_index == 23 and guard.ring.newest().name == "guard-000000001.pt"
    assert len(guard.ring.unwritten) == 4  # 5, 10, 15 and 20... all refused
    assert not list(tmp_path.glob("*.pt.json")) or all(
        (p.with_suffix("")).exists() for p in tmp_path.glob("*.pt.json")
    )  # no sidecar without its checkpoint
    guard.close()
    assert read_run(guard.run_path)[0]["step"].tolist() == list(range(23))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="the fd's path from /proc")
def test_a_rescue_whose_forensics_the_disk_refuses_goes_on(tmp_path, monkeypatch):
    disk = FullDisk(monkeypatch, tmp_path, only=".state.pt.")  # the forensics' state file
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off", policy=FULL)
    _steps(guard, model, opt, 12)
    disk.fill()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guard.force_next("rescue")
        _steps(guard, model, opt, 3, seed=1)
    said = _said(caught, "could not write the forensics of step 12")
    assert len(said) == 1 and "[Errno 28]" in said[0]
    rescue = [e for s, e in guard.events if s == 12]
    assert "forensics:unwritten" in rescue and any(e.startswith("rollback:") for e in rescue)
    assert guard.step_index == 15
    guard.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="the fd's path from /proc")
def test_an_origin_the_disk_refuses_is_said_once_and_no_older_one_stands(tmp_path, monkeypatch):
    old = tmp_path / "guard-origin.pt"
    old.write_bytes(b"an older run's origin")  # another run used the folder before
    disk = FullDisk(monkeypatch, tmp_path, only=".guard-origin")
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off", policy=FULL)
    disk.fill()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _steps(guard, model, opt, 10)
    said = _said(caught, "could not write checkpoint")
    assert len(said) == 1 and "guard-origin.pt" in said[0] and "[Errno 28]" in said[0]
    assert guard.step_index == 10 and not old.exists()  # no restart lands on another run's
    assert guard.ring.newest() is not None  # the ring's checkpoints are written as before
    guard.close()
