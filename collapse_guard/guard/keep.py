"""<KEEP>: what a healthy checkpoint holds (the guard's state among it: :func:`guard_state`),
and which checkpoint a resume starts from.

The ring itself (atomic writes, verification, averaging) is ``checkpoints.py``.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from collapse_guard.guard.checkpoints import CheckpointRing, CorruptCheckpoint, load_verified
from collapse_guard.guard.state import STATE_VERSION, RunState, Training, Trajectory
from collapse_guard.runfiles.lineage import continuing, cut_after, run_files, supersede

__all__ = [
    "RECORDED_LOSS_STEPS",
    "check_state",
    "check_version",
    "checkpoint_state",
    "drop_unkept_rows",
    "load_resume",
    "recorded_after",
    "resume_point",
    "resume_run",
    "save_checkpoint",
    "save_origin",
]

RECORDED_LOSS_STEPS = 20  # a checkpoint's recorded loss: the mean of this many last losses
# (the label's smoothing time constant is 10 steps: 20 averages out a step's noise)


def save_origin(ring: CheckpointRing, step: int, training: Training, guard: dict[str, Any]) -> None:
    """The state before the guard's first update into ``ring.origin()`` (a restart's
    weights); a disk that refuses it does not stop training: said once, and an older run's
    origin in the folder is removed, so that no rescue restarts from it."""
    try:
        ring.save_origin(step, checkpoint_state(training, guard, ()))
    except OSError as error:
        _unwritten(ring, ring.origin(), _refused(error))
        ring.origin().unlink(missing_ok=True)


def checkpoint_state(
    training: Training, guard: dict[str, Any], losses: Iterable[float]
) -> dict[str, Any]:
    """A checkpoint's dict: the training state, the guard's, and the recorded loss (the
    ring's basin test, checkpoints.py, reads it from the sidecar)."""
    recent = list(losses)[-RECORDED_LOSS_STEPS:]
    return {
        **training.state(),
        "guard": guard,
        "loss": sum(recent) / len(recent) if recent else math.nan,
    }


def resume_point(
    ring: CheckpointRing,
    path: str | os.PathLike | None,
    tidy: bool,
    accept: Callable[[Path, dict[str, Any]], None] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """The checkpoint a resume loads and its state: ``path``, or the ring's newest valid
    one that ``accept`` takes (``tidy``: the ones refused renamed ``*.corrupt``, said in
    one warning)."""
    if path is not None:  # the one asked for, or an error naming it
        state = load_verified(path)
        if accept is not None:
            accept(Path(path), state)
        return Path(path), state
    found, state, skipped = ring.newest_valid(tidy=tidy, accept=accept)
    if skipped:
        warnings.warn(
            f"collapse-guard resume: skipped {len(skipped)} damaged checkpoint(s) in "
            f"{ring.folder} (renamed *.corrupt): {'; '.join(skipped)}; resuming from "
            f"{found.name if found else 'none'}",
            RuntimeWarning,
            stacklevel=4,  # the loop's call of Guard.resume
        )
    if found is None and skipped:
        raise CorruptCheckpoint(
            f"no valid guard checkpoint in {ring.folder} to resume from (skipped: "
            f"{'; '.join(skipped)})",
            "start the run afresh, or point checkpoint_dir at the run's folder",
        )
    if found is None:
        raise FileNotFoundError(f"no guard checkpoint in {ring.folder} to resume from")
    return found, state


def save_checkpoint(
    ring: CheckpointRing,
    writer: Any,
    step: int,
    training: Training,
    guard: dict[str, Any],
    losses: Iterable[float],
) -> Path | None:
    """A healthy checkpoint of the state after step ``step - 1`` into the ring; the run
    file's rows up to it are made durable first. A disk that refuses either (full, gone)
    does not stop training: the checkpoint is not written, said once (:func:`_unwritten`),
    and tried again at the next one; returns the path, or None when it was not written."""
    path = ring.path_of(step)
    if writer is not None:
        writer.flush()  # the guard's writer keeps its rows when the disk refuses them
        if not getattr(writer, "durable", True):
            _unwritten(ring, path, f"the run file {writer.path.name} could not be written")
            return None
    try:
        return ring.save(step, checkpoint_state(training, guard, losses))
    except OSError as error:
        _unwritten(ring, path, _refused(error))
        return None


def _refused(error: OSError) -> str:
    return f"{type(error).__name__} [Errno {error.errno}] {error.strerror}"


def _unwritten(ring: CheckpointRing, path: Path, why: str) -> None:
    """Say once a run, loudly, that a checkpoint could not be written, and what stands."""
    ring.unwritten.append(path.name)
    if len(ring.unwritten) > 1:
        return
    kept = ", ".join(p.name for p in ring.paths()) or "none yet"
    warnings.warn(
        f"collapse-guard: could not write checkpoint {path} ({why}); training goes on "
        f"without it: a rescue or a resume uses the ring's older ones ({kept}). The guard "
        "tries again at every later checkpoint and says no more; free space in "
        f"{ring.folder} (or point checkpoint_dir at a larger disk)",
        RuntimeWarning,
        stacklevel=5,  # the loop's call of guard.step
    )


def check_state(state: Mapping[str, Any], training: Training) -> str:
    """Why a checkpoint's dict cannot be resumed into ``training`` ("" when it can): the
    keys a guard checkpoint holds, every floating tensor of model and optimizer finite
    (the guard writes only finite ones), the model's keys and shapes, and the optimizer's
    groups and (for torch's own optimizers) its state's shapes."""
    missing = [k for k in _KEYS if k not in state]
    if missing:
        return f"it lacks {missing} (a guard checkpoint holds {list(_KEYS)})"
    wrong = [k for k in _KEYS[1:] if not isinstance(state[k], Mapping)]
    if isinstance(state["step"], bool) or not isinstance(state["step"], int) or wrong:
        return f"its {wrong or 'step'} is not what a guard checkpoint holds"
    run = state["guard"].get("run")
    if not isinstance(run, Mapping) or "run_id" not in run or "step_index" not in run:
        return "its guard state lacks the run (run_id, step_index)"
    for part in ("model", "optimizer"):
        where = _nonfinite(state[part], part)
        if where:
            return f"{where} holds NaN or inf (the guard writes only finite checkpoints)"
    return _model_mismatch(state["model"], training.model) or _optimizer_mismatch(
        state["optimizer"], training.optimizer
    )


_KEYS = ("step", "model", "optimizer", "guard")


def _nonfinite(value: Any, where: str) -> str:
    """The first floating tensor under ``value`` with a non-finite element, by its place."""
    if isinstance(value, torch.Tensor):
        floating = value.is_floating_point() or value.is_complex()
        return where if floating and not bool(torch.isfinite(value).all()) else ""
    if isinstance(value, Mapping):
        items: Iterable = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return ""
    for key, item in items:
        found = _nonfinite(item, f"{where}[{key!r}]")
        if found:
            return found
    return ""


def _model_mismatch(saved: Mapping[str, Any], model: Any) -> str:
    live = model.state_dict()
    missing, unexpected = sorted(set(live) - set(saved)), sorted(set(saved) - set(live))
    shapes = [
        f"{k}: {tuple(saved[k].shape)} where the model has {tuple(v.shape)}"
        for k, v in live.items()
        if k in saved and isinstance(v, torch.Tensor)
        and (not isinstance(saved[k], torch.Tensor) or saved[k].shape != v.shape)
    ]  # fmt: skip
    if not (missing or unexpected or shapes):
        return ""
    said = [f"missing {missing[:3]}"] if missing else []
    said += [f"unexpected {unexpected[:3]}"] if unexpected else []
    said += [f"shapes {'; '.join(shapes[:3])}"] if shapes else []
    return f"its model state does not match this model ({', '.join(said)})"


def _optimizer_mismatch(saved: Mapping[str, Any], optimizer: Any) -> str:
    groups, state = saved.get("param_groups"), saved.get("state")
    live = [g["params"] for g in optimizer.param_groups]
    if not isinstance(groups, list) or not isinstance(state, Mapping):
        return "its optimizer state lacks param_groups or state"
    sizes = [len(g.get("params", ())) if isinstance(g, Mapping) else -1 for g in groups]
    if sizes != [len(p) for p in live]:
        return f"its optimizer has groups of {sizes} parameters, this one {[len(p) for p in live]}"
    params = [p for group in live for p in group]
    ids = [i for g in groups for i in g["params"]]
    by_id = dict(zip(ids, params, strict=True))
    own = type(optimizer).__module__.startswith("torch.optim")
    own = own and type(optimizer).__name__ in _PARAM_SHAPED
    for key, entry in state.items():
        if key not in by_id or not isinstance(entry, Mapping):
            return f"its optimizer state names parameter {key!r}, which no group holds"
        shape = by_id[key].shape
        for name, value in entry.items() if own else ():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != shape:
                return (
                    f"its optimizer state {name!r} of parameter {key} has shape "
                    f"{tuple(value.shape)} where the parameter has {tuple(shape)}"
                )
    return ""


# torch's optimizers whose per-parameter state tensors are the parameter's shape (or 0-d:
# the step): their shapes are checked; others (Adafactor's factored moments) are not
_PARAM_SHAPED = frozenset(
    ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam", "Adadelta", "Rprop")
)


def check_version(guard: Mapping[str, Any]) -> None:
    """A guard state of another release is an error (not damage: no fallback)."""
    if guard.get("version") != STATE_VERSION:
        raise ValueError(
            f"guard state version {guard.get('version')!r}, this code reads "
            f"{STATE_VERSION}; resume with the collapse-guard release that saved it"
        )


def load_resume(
    ring: CheckpointRing,
    training: Training,
    path: str | os.PathLike | None,
    tidy: bool,
    guard: Callable[[Mapping[str, Any]], Any],
    own: str,
) -> tuple[Path, dict[str, Any]]:
    """:func:`resume_point` whose checkpoint passed :func:`check_state` and loaded into
    ``training`` and, through ``guard``, the guard's state (a checkpoint that fails any of
    it is the next one's turn); adopted by the ring (its lineage). The run goes on after
    the last step its run files recorded (:func:`recorded_after`); after a crash, the rows
    recorded past the checkpoint leave the folder (:func:`drop_unkept_rows`). ``own``: the
    resuming run's id."""

    def accept(candidate: Path, state: dict[str, Any]) -> None:
        why = check_state(state, training)
        if not why:
            check_version(state["guard"])
            try:
                training.load(state)
                guard(state["guard"])
            except (RuntimeError, KeyError, IndexError, TypeError, ValueError) as error:
                first = (str(error).strip().splitlines() or [""])[0][:200]
                why = f"it does not load into this model ({type(error).__name__}: {first})"
        if why:
            raise CorruptCheckpoint(f"{candidate}: {why}", "delete it; older ones are intact")

    path, state = resume_point(ring, path, tidy, accept)
    ring.adopt(path, tidy=tidy)
    start = recorded_after(ring.folder, path, state, say=tidy)
    if tidy and start == state["guard"]["run"]["step_index"]:
        drop_unkept_rows(ring.folder, path, str(state["guard"]["run"]["run_id"]), start, own)
    if start != state["guard"]["run"]["step_index"]:
        state["guard"]["run"]["step_index"] = start
        guard(state["guard"])
    return path, state


def resume_run(
    setup: Any, run: RunState, path: str | os.PathLike | None, load: Callable[[Any], Any]
) -> int:
    """``Guard.resume``: the checkpoint (``path`` or the newest valid) loaded through
    ``load`` (the guard's ``load_state_dict``), ``run`` marked as resumed from it and the
    run file's lineage written from its first chunk on; the step to continue from. Rank 0
    alone tidies and warns."""
    tidy = setup.rank == 0
    found, state = load_resume(setup.ring, setup.training, path, tidy, load, setup.run_id)
    run.resumed(found.name, state["guard"]["run"]["run_id"])
    if setup.writer is not None:
        setup.writer.update_meta(extra={"continues": run.continues})
    return run.step_index


def recorded_after(folder: Path, path: Path, state: Mapping[str, Any], say: bool = True) -> int:
    """The step a resume from checkpoint ``path`` goes on at: the checkpoint's, or, where
    its run (or a run that continues it) had finished (closed normally) past it, the step
    after the last recorded one: a finished run is not trained again, and no step is
    recorded twice. Said in a warning. A run whose process stopped goes on at the
    checkpoint's step: the steps after it are trained again from its weights (their old
    rows leave the folder: :func:`drop_unkept_rows`)."""
    step = int(state["guard"]["run"]["step_index"])
    last, run_id, finished = _last_recorded(folder, str(state["guard"]["run"]["run_id"]))
    if last is None or last < step or not finished:
        return step
    if say:  # DDP's other ranks: rank 0 says it
        warnings.warn(
            f"collapse-guard resume: run {run_id} finished (closed normally) at step {last}, "
            f"past checkpoint {path.name} (the state after step {step - 1}): resuming at step "
            f"{last + 1}, so that no step is trained or recorded twice (the weights are the "
            "checkpoint's); to train on, run more steps from there",
            RuntimeWarning,
            stacklevel=4,  # the loop's call of Guard.resume
        )
    return last + 1


def _last_recorded(folder: Path, run_id: str) -> tuple[int | None, str, bool]:
    """The last step recorded by run ``run_id``'s file and the files that continue it
    (by their ``extra["continues"]``), the run that recorded it, and whether that file was
    closed normally (the guard's summary in its metadata). Files that cannot be read are
    left out (a resume is not refused for them)."""
    import pyarrow.parquet as pq  # the run files' own: lazily

    runs = run_files(folder)
    best: tuple[int | None, str, bool] = (None, run_id, False)
    for rid in sorted(({run_id} | continuing(runs, run_id)) & set(runs)):
        file, meta = runs[rid]
        try:
            steps = pq.read_table(file, columns=["step"]).column("step").to_pylist()
        except Exception:  # as above
            continue
        if steps and (best[0] is None or steps[-1] > best[0]):
            best = (steps[-1], rid, "guard" in meta.extra)
    return best


def drop_unkept_rows(folder: Path, checkpoint: Path, run_id: str, step: int, own: str) -> None:
    """After a crash the run goes on from ``checkpoint`` (run ``run_id``'s state before
    ``step``): the rows recorded from ``step`` on, by that run or the runs that continued
    it, were trained from weights now thrown away. They leave the folder (cut from the
    run's file; the continuing runs' files superseded: runfiles/lineage.py), so the run
    files hold every step once; said in one warning. ``own``: the resuming run's id."""
    runs = run_files(folder)
    said = []
    if run_id in runs:
        gone = cut_after(runs[run_id][0], step, f"resumed from {checkpoint.name}")
        if gone:
            said.append(f"steps {gone[0]}-{gone[-1]} of run {run_id} taken out of its file")
    for rid in sorted(continuing(runs, run_id) - {own}):
        said.append(f"{supersede(runs[rid][0]).name} set aside (run {rid}, after the checkpoint)")
    if said:
        warnings.warn(
            f"collapse-guard resume: the run goes on from {checkpoint.name} at step {step} "
            f"(the process stopped): the rows recorded after it are trained again, so "
            f"{'; '.join(said)}",
            RuntimeWarning,
            stacklevel=4,  # the loop's call of Guard.resume
        )


def guard_state(
    run: RunState, trajectory: Trajectory, holds: Mapping[str, Any], run_id: str
) -> dict[str, Any]:
    """``Guard.state_dict()``: the run's kept fields (with the run file's id, which a
    resumed run continues) and the trajectory. ``holds``: key -> an object with
    ``state_dict`` kept beside them (the risk hold: a warning held before resuming holds
    on; the warn's LR hold: a rise stopped stays stopped)."""
    kept_holds = {key: hold.state_dict() for key, hold in holds.items()}
    kept_run = {**run.state_dict(), "run_id": run_id, **kept_holds}
    return {"version": STATE_VERSION, "run": kept_run, "trajectory": trajectory.state_dict()}


def load_guard_state(
    state: Mapping[str, Any], run: RunState, trajectory: Trajectory, holds: Mapping[str, Any]
) -> None:
    """Restore :func:`guard_state` into ``run``, ``trajectory`` and ``holds``."""
    check_version(state)
    run.load_state_dict(state["run"])
    for key, hold in holds.items():
        if key in state["run"]:  # absent in checkpoints saved before that hold
            hold.load_state_dict(state["run"][key])
    trajectory.load_state_dict(state["trajectory"])
