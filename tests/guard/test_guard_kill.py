"""Preemption: a guarded loop SIGKILLed at random moments loses no step before its last
durable point, resumes where that point is, and its run files chain end to end.

The durable point is the newest checkpoint: every checkpoint makes the run file's rows up
to it durable first, and a resumed run's file names the run it continues from its first
chunk on. ``COLLAPSE_GUARD_KILLS=20 pytest -s tests/guard/test_guard_kill.py`` tries more
kills and prints the figures (benchmarks/README.md).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collapse_guard.runfiles import list_runs, read_meta, read_run

KILLS = int(os.environ.get("COLLAPSE_GUARD_KILLS", "5"))
STEPS = 40 + 12 * KILLS  # enough steps that every kill lands in the run
WORKER = Path(__file__).with_name("kill_worker.py")


def _start(folder: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(folder), str(STEPS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _live(process: subprocess.Popen, rng: random.Random) -> tuple[int, int]:
    """Let the process run a random number of steps, then SIGKILL it a random few
    milliseconds later (often inside a checkpoint or run-file write); returns the step it
    resumed at and the last step it reported done."""
    resumed = int(process.stdout.readline().split()[1])
    last, target = resumed - 1, rng.randint(2, 12)
    for line in process.stdout:
        last = int(line.split()[1])
        if last - resumed + 1 >= target:
            break
    time.sleep(rng.uniform(0.0, 0.02))
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    for line in process.stdout:  # lines written before the kill landed
        if line.startswith("step"):
            last = int(line.split()[1])
    return resumed, last


def _chain(folder: Path) -> list[tuple[str, int, list[int]]]:
    """The run files from the last back to the first, by their lineage: (run id, the
    step it continues from, its steps)."""
    by_id = {read_meta(p).run_id: p for p in list_runs(folder)}
    final = [p for p in by_id.values() if read_meta(p).extra.get("guard")]
    assert len(final) == 1, "one run closed: the last"
    chain, path = [], final[0]
    while path is not None:
        frame, meta = read_run(path)
        continues = meta.extra.get("continues")
        chain.append((meta.run_id, continues["step"] if continues else 0, frame["step"].tolist()))
        path = by_id[continues["run_id"]] if continues else None  # KeyError: a broken link
    return chain[::-1]


@pytest.mark.slow  # 6 interpreters importing torch: 55-110 s on the loaded 2-core machine
def test_sigkill_at_random_moments_loses_nothing_before_the_durable_point(tmp_path):
    rng = random.Random(22)
    lives = []
    for _ in range(KILLS):
        resumed, last = _live(_start(tmp_path), rng)
        lives.append((resumed, last))
    final = _start(tmp_path)
    out, err = final.communicate(timeout=300)
    assert final.returncode == 0, err[-2000:]
    resumes = [r for r, _ in lives] + [int(out.split()[1])]
    lost = [last + 1 - nxt for (_, last), nxt in zip(lives, resumes[1:], strict=True)]
    # resume continues: at the durable point, never past the last step done; -1 where the
    # kill landed after a step's checkpoint and before its "step" line was printed
    assert all(-1 <= n for n in lost), (lives, resumes)
    # a checkpoint every 3 healthy steps after 2 quiet ones: at most 2 + 3 steps redone, and
    # one more when the kill lands inside a checkpoint's write
    assert max(lost) <= 6, lost
    chain = _chain(tmp_path)
    steps = []
    for (_, start, rows), (_, next_start, _) in zip(
        chain, [*chain[1:], (None, STEPS, None)], strict=True
    ):
        assert rows[0] == start  # each file starts where the one it continues left off
        kept = [s for s in rows if s < next_start]
        assert kept == list(range(start, next_start)), (start, next_start, rows)
        steps += kept
    assert steps == list(range(STEPS))  # lineage holds end to end: every step once
    # and the folder itself: the rows a crash left past its checkpoint were set aside
    recorded = sorted(s for p in list_runs(tmp_path) for s in read_run(p)[0]["step"])
    assert recorded == list(range(STEPS)), "a step recorded twice or not at all"
    assert not list(tmp_path.glob(".*.tmp*"))  # what killed writes left, cleaned at start
    print(
        f"\nkills tried {KILLS}, steps {STEPS}, steps redone per kill {lost} "
        f"(mean {sum(lost) / len(lost):.1f}, max {max(lost)}), files in the chain {len(chain)}, "
        f"run files {len(list_runs(tmp_path))}, "
        f"set aside {len(list(tmp_path.glob('*.superseded')))}"
    )


# issue 31, case 9: a resume after the run finished (or after rows were made durable past
# the newest checkpoint) goes on after the last step recorded, and says so.


def _loop(guard, model, opt, steps):
    from guard_helpers import Loop

    for step in steps:  # kill_worker's loop: each step's batch depends on the step alone
        guard.step(Loop(seed=step).loss(model))
        opt.zero_grad()


def _resumed(folder):
    import warnings

    from guard_helpers import tiny_model

    from collapse_guard.guard import Guard

    model, opt = tiny_model(seed=3)
    guard = Guard(model, opt, folder, risk="off", policy=_CONFIG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = guard.resume()
    said = [str(w.message) for w in caught if "collapse-guard resume:" in str(w.message)]
    return guard, model, opt, start, said


_CONFIG = {"checkpoint_every": 3, "healthy_quiet_steps": 2}  # kill_worker.CONFIG


def test_a_resume_after_a_finished_run_records_no_step_twice(tmp_path):
    from guard_helpers import tiny_model

    from collapse_guard.guard import Guard

    model, opt = tiny_model()
    first = Guard(model, opt, tmp_path, risk="off", policy=_CONFIG)
    _loop(first, model, opt, range(20))
    first.close()  # finished: steps 0-19
    newest = int(first.ring.newest().name[6:15])
    assert newest < 20  # the last checkpoint is older than the last step: the case
    guard, model, opt, start, said = _resumed(tmp_path)
    assert start == 20 and guard.step_index == 20
    assert len(said) == 1 and f"run {first.run_id} finished (closed normally)" in said[0]
    assert "at step 19" in said[0] and "no step is trained or recorded twice" in said[0]
    _loop(guard, model, opt, range(start, 24))
    guard.close()
    second, meta = read_run(guard.run_path)
    assert meta.extra["continues"]["step"] == 20 and second["step"].tolist() == [20, 21, 22, 23]
    steps = read_run(first.run_path)[0]["step"].tolist() + second["step"].tolist()
    assert steps == list(range(24))  # every step once


def test_a_resume_after_a_crash_trains_again_from_the_checkpoint(tmp_path):
    from guard_helpers import tiny_model

    from collapse_guard.guard import Guard

    model, opt = tiny_model()
    first = Guard(model, opt, tmp_path, risk="off", policy=_CONFIG)
    _loop(first, model, opt, range(14))
    first._writer.flush()  # a chunk made durable after the checkpoint; then killed
    newest = int(first.ring.newest().name[6:15])
    assert newest < 14
    guard, model, opt, start, said = _resumed(tmp_path)
    # the process stopped (no normal close): the steps after the checkpoint train again,
    # and their first recording leaves the crashed run's file (said once)
    assert start == newest and len(said) == 1
    assert f"steps {newest}-13 of run {first.run_id} taken out of its file" in said[0]
    assert read_run(first.run_path)[0]["step"].tolist() == list(range(newest))
    assert read_meta(first.run_path).extra["cut"][0]["from_step"] == newest
    _loop(guard, model, opt, range(start, 16))
    guard.close()
    assert read_run(guard.run_path)[0]["step"].tolist() == list(range(newest, 16))


def test_a_run_killed_before_its_first_checkpoint_is_set_aside_at_the_next_resume(tmp_path):
    from guard_helpers import tiny_model

    from collapse_guard.guard import Guard
    from collapse_guard.runfiles import SUPERSEDED

    model, opt = tiny_model()
    first = Guard(model, opt, tmp_path, risk="off", policy=_CONFIG)
    _loop(first, model, opt, range(14))
    first._writer.flush()  # then killed
    checkpoint = first.ring.newest().name
    second, model2, opt2, start, _ = _resumed(tmp_path)
    _loop(second, model2, opt2, [start])
    second._writer.flush()  # one step recorded, killed before a checkpoint of its own
    assert second.ring.newest().name == checkpoint
    third, model3, opt3, again, said = _resumed(tmp_path)
    assert again == start  # the same checkpoint: the second life's step trains again
    assert len(said) == 1 and f"run-{second.run_id}.parquet{SUPERSEDED} set aside" in said[0]
    _loop(third, model3, opt3, range(again, 18))
    third.close()
    assert not second.run_path.exists()
    assert second.run_path.with_name(second.run_path.name + SUPERSEDED).exists()
    recorded = sorted(s for p in list_runs(tmp_path) for s in read_run(p)[0]["step"])
    assert recorded == list(range(18))  # every step once, in the first and third files
