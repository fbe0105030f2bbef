"""The guard: observes through its own probe, decides, and acts, inside the user's loop.

The guarded loop, drawn once (``<...>`` marks what ``guard.step`` does, in order, and the
module that does it)::

    guard = Guard(model, optimizer, checkpoint_dir="ckpt")   # preflight warnings here
    for x, y in guard.batches(loader):        # skips the batches a rescue asked to skip
        for group in optimizer.param_groups:  # (optional: nanoGPT sets the LR itself)
            group["lr"] = lr_at(step)
        logits, loss = model(x, y)
        loss.backward()                       # (scaler.scale(loss).backward() with AMP)
        decision = guard.step(loss)           # replaces clipping and optimizer.step():
            # <CHECK>     the loss is one number; the gradients are this step's (check.py)
            # <POLL>      the newest risk answer, if one arrived: level and probability
            # <UNSCALE>   scaler.unscale_ with a GradScaler, unless the loop did (measure.py)
            # <MEASURE>   probe.after_backward(loss); per-tensor gradient norms; one sync
            #             (none for a deferred step: deferred.py)
            # <DECIDE>    decision.decide(facts), amended (amend.py): skip / rescue / level
            # <APPLY>     clip, LR x multiplier, optimizer.step() or not, scaler.update(),
            #             rank 0's QK-clip plan (qk_clip.py), probe.after_step() (apply.py)
            # <RESCUE>    forensics, roll back to the ring's average (a collapse in the
            #             warmup: to the origin, guard-origin.pt, written at the first
            #             step), skip batches, cap the LR (rescue.py)
            # <RECORD>    counts and histories (tally.py); the row and events into the run
            #             file, source "guarded" (record.py)
            # <KEEP>      a healthy checkpoint when due (keep.py); the window to the risk
        optimizer.zero_grad()
        scheduler.step()                      # any torch scheduler, or none
    guard.close()                             # flushes the run file; idempotent

The probe observes and never acts; every change to training is made by the applier, from
a :class:`GuardDecision`. Each part returns facts, events or state and no part calls the
next: :meth:`Guard.step` calls them in this order. The state is two dataclasses
(state.py); the facts are read at once or a step later (``sync``: deferred.py).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from collapse_guard.guard import check, ddp, measure
from collapse_guard.guard.amend import Decider, gather_facts, healthy_before_jump
from collapse_guard.guard.apply import Applier
from collapse_guard.guard.decision import GuardDecision
from collapse_guard.guard.keep import (
    guard_state,
    load_guard_state,
    resume_run,
    save_checkpoint,
    save_origin,
)
from collapse_guard.guard.policy import GuardPolicy, resolve_policy
from collapse_guard.guard.preflight import warn_preflight
from collapse_guard.guard.qk_clip import QKMapping
from collapse_guard.guard.record import close_extra
from collapse_guard.guard.rescue import GuardGaveUp, Rescuer, data_fault_text, gave_up
from collapse_guard.guard.risk_spec import RiskSpec
from collapse_guard.guard.setup import build_setup
from collapse_guard.guard.state import STATE_VERSION, InState, RunState
from collapse_guard.guard.tally import tally
from collapse_guard.guard.trackers import TrackerSpec
from collapse_guard.probe import ProbeConfig

__all__ = ["STATE_VERSION", "Guard", "GuardGaveUp"]


class Guard:
    """Observe and act: ``decision = guard.step(loss)`` in place of ``optimizer.step()``.

    Args:
        model: the module being trained (a DDP wrapper is fine).
        optimizer: its optimizer.
        checkpoint_dir: folder of the healthy-checkpoint ring, the run file
            (``run-<run_id>.parquet``) and the forensics of rescues.
        scaler: the AMP ``GradScaler``, if any: the guard unscales, steps and updates it.
        risk: None or ``"embedded"`` (the bundled model), ``"off"`` (reactive path
            only), ``ServiceRisk(url, fallback=MODEL)`` (the model scoring while the
            service fails; default the bundled one), a URL or a ``RiskClient``, a
            ``RiskModel`` or a model folder (risk_spec.py).
        policy: a :class:`GuardPolicy` or a mapping of its fields (``config=``: its old
            name, deprecated).
        probe_config: the owned probe's :class:`ProbeConfig`.
        run_id: the run file's id (default: a fresh uuid); ``record=False``: no run file.
        token, timeout: for a service URL (deprecated: ``ServiceRisk`` carries them).
        preflight: warn where the set-up is outside the seed's safe ranges.
        qk_layouts: where the q and k heads of attention modules the guard cannot read
            are (``GuardPolicy.qk_clip``): module name -> ``QKLayout``, or a callable
            ``(name, module) -> QKLayout | None``.
        sync: when the host reads a step's loss and gradient norm: ``"step"`` (at the
            step, one sync), ``"deferred"`` (at the next: a healthy step does not sync; the
            optimizer must skip on the device, ``fused=True`` Adam, AdamW or SGD; a rescue
            comes a step later: deferred.py) or ``"auto"`` (deferred for such an optimizer
            on a GPU, else ``"step"``: on the CPU a read costs no stall).
        trackers: where the guard's numbers go every ``risk_every`` steps (trackers.py):
            default the active MLflow run, if any; a ``SummaryWriter``, a callable, a list.
    """

    # what loops, tests and integrations read, where it lives (a descriptor each, named
    # by the class: hence the generators)
    policy, probe, param_names, params = (InState("setup") for _ in range(4))
    history, ring, folder, rank, qk = (InState("setup") for _ in range(5))
    risk, run_id, _writer = InState("setup"), InState("setup"), InState("setup", "writer")
    model, optimizer, scaler = InState("training"), InState("training"), InState("training")
    step_index, level, probability, rescues = (InState("run") for _ in range(4))
    skipped, checkpoints, lr_ceiling, pending_skips = (InState("run") for _ in range(4))
    first_warning, events, qk_clips, qk_pending = (InState("run") for _ in range(4))
    risk_source, risk_model_version, risk_readings = (InState("run") for _ in range(3))
    window, loss_history, lr_in_force = (InState("trajectory") for _ in range(3))

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        checkpoint_dir: str | os.PathLike = "guard-checkpoints",
        *,
        scaler: Any = None,
        risk: RiskSpec = None,
        policy: GuardPolicy | Mapping[str, Any] | None = None,
        probe_config: ProbeConfig | Mapping[str, Any] | None = None,
        run_id: str | None = None,
        record: bool = True,
        token: str | None = None,
        timeout: float | None = None,
        preflight: bool = True,
        qk_layouts: QKMapping = None,
        sync: str = "auto",
        trackers: TrackerSpec = None,
        config: GuardPolicy | Mapping[str, Any] | None = None,
    ) -> None:
        self.setup, self.trajectory = build_setup(
            model, optimizer, checkpoint_dir, resolve_policy(policy, config), scaler=scaler,
            risk=risk, probe_config=probe_config, run_id=run_id, record=record, token=token,
            timeout=timeout, preflight=preflight, qk_layouts=qk_layouts, sync=sync,
            trackers=trackers,
        )  # fmt: skip
        self.training, self._sync = self.setup.training, self.setup.sync
        self._apply = Applier(self.setup)
        self._decide = Decider(self.setup, self._apply.hold)
        self._holds = {"risk_hold": self.setup.hold, "lr_hold": self._apply.hold}  # kept
        self._rescue, self._marks = Rescuer(self.setup), check.GradientMarks()
        self.run, self._closed = RunState.fresh(self.policy), False
        self._origin_due = bool(self.policy.restart_window)  # written at the first step
        if preflight and self.rank == 0:
            warn_preflight(model, optimizer, self.policy.clip)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The guard's own state (plain values: loads with ``weights_only=True``)."""
        self._settle()  # a deferred step belongs to the state it left
        return guard_state(self.run, self.trajectory, self._holds, self.run_id)

    def load_state_dict(self, state: Mapping[str, Any]) -> Guard:
        """Restore :meth:`state_dict` (a resumed run keeps its history); returns self."""
        self._sync.forget()  # the state replaces a deferred step
        load_guard_state(state, self.run, self.trajectory, self._holds)
        self.probe.step = self.run.step_index
        return self

    def resume(self, path: str | os.PathLike | None = None) -> int:
        """Load model, optimizer, scaler and guard state (its history too) from a ring
        checkpoint (default: the newest valid one that loads); returns the step to continue
        from (keep.py: no step is recorded twice). The run records into a new run file
        whose metadata names the run it continues (``extra["continues"]``: run_id, step,
        checkpoint): the files end to end are the run. Rank 0 alone tidies and warns."""
        self._origin_due = False  # the run's origin is the folder's, from its first start
        return resume_run(self.setup, self.run, path, self.load_state_dict)

    # --------------------------------------------------------------- batches
    def should_skip_batch(self) -> bool:
        """True while a rescue asks to skip batches (each call consumes one)."""
        return self.run.take_skip()

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """``loader``'s batches, less those a rescue asked to skip."""
        for batch in loader:
            if not self.should_skip_batch():
                yield batch

    def force_next(self, action: str) -> None:
        """Make the next step ``"skip"``, ``"rescue"`` or ``"checkpoint"`` (tests, drills)."""
        self._decide.force(action)

    def data_changed(self) -> None:
        """Say that the data changes on purpose from the next step (a new mixture, a
        curriculum's next stage, fine-tuning data). The loss jumps with the data, and the
        guard would read the jump as a collapse: it would roll back to the old data's
        weights, at which every new batch is an outlier, and stop the run as one whose data
        went bad. Here the loss's history, best and outlier statistics, the risk window and
        the run context start over; the ring's checkpoints of the old data, whose losses
        are not comparable, leave it (the origin stays); the next step is checkpointed, with
        the event ``data_changed`` in its row. Call it on every rank, between steps."""
        if self._closed:
            raise RuntimeError("guard.data_changed() after guard.close(); create a new Guard")
        self._settle()  # a deferred step belongs to the old data
        self.trajectory = self.trajectory.restarted(self.policy)
        self.run.data_fault, self.run.skip_streak = False, 0
        self._decide.data_changed()
        if self.rank == 0:
            self.setup.ring.restart()

    # ------------------------------------------------------------------ step
    def step(self, loss: torch.Tensor | float) -> GuardDecision:
        """Measure, decide and act for one optimizer step (module docstring). A deferred
        step (``sync="deferred"``) returns the decision its healthy facts give; the one it
        is booked with (events, run file) is made at the next call."""
        if self._closed:
            raise RuntimeError("guard.step() after guard.close(); create a new Guard")
        loss_t = check.scalar_loss(loss)
        self._settle()  # the last step's facts, if it was deferred: before anything reads state
        if self._origin_due:
            self._keep_origin()
        run, trajectory, amp = self.run, self.trajectory, measure.amp_enabled(self.scaler)
        discard = self._sync.take_discard()  # a deferred rescue rolled back after this backward
        stale = self._marks.stale(self.params) or discard  # before unscale_ writes the grads
        loop_lr = float(self.optimizer.param_groups[0]["lr"])
        if measure.jump_starts(run.loop_lrs, loop_lr, self.policy):
            self._checkpoint_before_jump()
        run.note_loop_lr(loop_lr)
        self._poll()
        measure.unscale(self.scaler, self.optimizer)
        lr_jump = measure.lr_jumped(run.loop_lrs, self.policy)
        healthy = None
        forced = self._decide.forced is not None or self._apply.hold.on  # a hold: host's
        if self._sync.may_defer(run, stale=stale, forced=forced, amp=amp):
            facts = gather_facts(run, trajectory, 0.0, 1.0, lr_jump=lr_jump)
            healthy = self._sync.healthy(facts)
        self.probe.host_reads = healthy is None
        self.probe.after_backward(loss)
        norms = measure.tensor_norms(self.probe, self.params)
        total = torch.linalg.vector_norm(norms) if len(norms) else torch.zeros(())
        if healthy is not None:
            self._sync.launch(healthy, loss_t, total, norms, run, trajectory, lr_jump)
            self._marks.mark(self.params)
            return healthy
        loss_value, grad_norm = measure.host_floats(loss_t, total)  # the step's sync
        if not stale and grad_norm == 0.0:  # zero_grad() and no backward, or a loss that
            stale = "zero_gradients"  # depends on no parameter
        if stale and stale != "after_rescue":
            self._warn_stale(stale)
        decision, qk_plan = ddp.share(
            (self._decide(run, trajectory, loss_value, grad_norm, norms, stale), run.qk_pending)
            if self.rank == 0
            else None
        )
        self._take(decision)
        bounds, ceiling = run.layer_bounds, run.lr_cap()
        record, clipped, lrs = self._apply(
            decision, grad_norm, norms, qk_plan, layer_bounds=bounds, lr_ceiling=ceiling
        )
        self._conclude(decision, norms, record, clipped, lrs)
        self._marks.mark(self.params)
        return decision

    def _settle(self) -> None:
        """Book the deferred step, if one is pending: decide it as the host would have at
        its step (the device's gate applied the same rules: checked), then book it."""
        settled = self._sync.take()
        if settled is None:
            return
        stale = "zero_gradients" if settled.grad_norm == 0.0 else ""
        if stale:
            self._warn_stale(stale)
        grad_norm, norms = settled.grad_norm, settled.norms
        decision = self._decide(self.run, self.trajectory, settled.loss, grad_norm, norms, stale)
        self._sync.check(settled, decision)
        self._take(decision)
        lrs = (settled.applied_lr, settled.loop_lr) if decision.apply_update else None
        self._conclude(decision, norms, settled.record, [], lrs, settled.maxima)
        self._sync.after(decision)

    def _warn_stale(self, why: str) -> None:
        self.setup.once.warn(why, check.stale_text(why, self.run.step_index), stacklevel=3)

    def _poll(self) -> None:
        reading = self.risk.poll() if self.risk is not None else None
        if reading is not None:
            self.run.hear(self.setup.hold(reading))
            level, own = self.run.level, self.setup.attention_every
            self.probe.config.attention_every = self.policy.attention_every(level, own)

    def _take(self, decision: GuardDecision) -> None:
        """A decision made: stop where it gives up, else its level's LR multiplier holds."""
        if decision.give_up:
            self._give_up(decision)
        if decision.data_fault and not self.run.data_fault:
            text = data_fault_text(decision.step, self.policy)
            self.setup.once.warn("data_fault", text, stacklevel=3)
        self.run.lr_multiplier = decision.lr_multiplier
        if decision.reason != "after_rescue":  # that step trained nothing: the next one is
            self.run.after_rollback = False  # the first at the restored weights

    def _conclude(
        self, decision: GuardDecision, norms: torch.Tensor, record: dict, clipped: list[str],
        lrs: tuple[float, float] | None, maxima: Mapping | None = None,
    ) -> None:  # fmt: skip
        """After the update: rank 0's QK-clip plan from this step's probe pass (``maxima``:
        a deferred step's), the LR in force and the warm-up check (``lrs``: the LR in force
        and the loop's, None without an update), and the book."""
        run, plan = self.run, {}
        if self.qk is not None and self.rank == 0:
            last, level = self.probe.last_pass, decision.level
            plan = self.qk.plan_after(last, level, run.rescues, decision.rescue, maxima)
        run.qk_pending = plan
        if lrs is not None:
            self.trajectory.lr_in_force, loop_lr = lrs
            warmup = self.setup.warmup
            warning = warmup.add(loop_lr) if warmup is not None else None
            if warning and self.rank == 0:
                warnings.warn(f"collapse-guard preflight: {warning}", UserWarning, stacklevel=3)
        self._book(decision, norms, record, clipped)

    def _give_up(self, decision: GuardDecision) -> None:
        self.run.events.extend((self.run.step_index, e) for e in decision.events)
        self.close()
        raise gave_up(decision, self.run.rescues, self.policy, self.folder)

    # -------------------------------------------------- record, rescue, keep
    def _book(
        self, decision: GuardDecision, norms: torch.Tensor, record: dict, clipped: list[str]
    ) -> None:
        """What follows the update: counts, the rescue, the run file's row, the
        checkpoint and the risk request of step ``step_index``, which then moves on."""
        run, s = self.run, self.run.step_index
        # the step's norms join the history now: the decision and the clipping judged them
        # against the steps before; the forensics of a rescue include them
        self.history.add(s, norms)
        hold, trajectory = self._apply.hold, self.trajectory
        events = [*decision.events, *clipped, *self._rescue.lift(decision, run, trajectory)]
        events += self._rescue.fall(decision, run, trajectory, hold)
        if run.jump_checkpoint == s:  # written before this step's update (step())
            events.append("checkpoint:before_jump")
        run.qk_clips += sum(e.startswith("qk_clip:") for e in clipped)  # less the hold's
        tally(decision, record, run, self.trajectory)
        if decision.rescue:
            rescued, self.trajectory = self._rescue(decision, norms, run, self.trajectory)
            events += rescued
        run.events.extend((s, e) for e in events)
        if self._writer is not None:
            self._writer.append(s, record, event=";".join(events))
        run.step_index += 1  # a checkpoint holds the state *after* step s: resume at s + 1
        if decision.checkpoint and not decision.rescue:
            self._checkpoint()
        self.setup.trackers.log(self)
        window = self.trajectory.window
        if self.risk is not None and (s + 1) % self.policy.risk_every == 0 and len(window):
            self.risk.submit(s, window.window(), self.trajectory.context.get())

    def _checkpoint(self) -> None:
        run = self.run
        if self.rank == 0:
            losses = self.trajectory.loss_history.values
            state = self.state_dict()
            save_checkpoint(self.ring, self._writer, run.step_index, self.training, state, losses)
        run.checkpoints += 1
        run.last_checkpoint = run.step_index - 1  # called after step_index moved on

    def _keep_origin(self) -> None:
        """The state before the first update (keep.save_origin): what a rescue in the
        warmup restarts from (amend.restarts)."""
        self._origin_due = False
        if self.rank == 0:
            save_origin(self.ring, self.run.step_index, self.training, self.state_dict())

    def _checkpoint_before_jump(self) -> None:
        """The loop's LR jumps at this step: the weights are still the schedule's. A
        healthy run keeps them (no update yet: the state after the last step), so that a
        rescue of the jump undoes the jump alone, not the ring's last 100 steps."""
        run = self.run
        run.jump_checkpoint = None  # an older jump's is no state before this one
        if run.last_checkpoint != run.step_index - 1:  # the last step's is this state
            if not healthy_before_jump(run, self.policy, self.params):
                return
            self._checkpoint()
        run.jump_checkpoint = run.step_index

    # ----------------------------------------------------------------- close
    def summary(self) -> dict[str, Any]:
        """Counts of what the guard did (also the run file's ``extra["guard"]``)."""
        return {**self.run.summary(), **self._apply.hold.summary()}  # warn_hold.py's too

    @property
    def run_path(self) -> Path | None:
        return self._writer.path if self._writer is not None else None

    def close(self) -> None:
        """Flush the run file (events in its metadata too) and stop the risk source."""
        if self._closed:
            return
        self._settle()
        self._closed = True
        if self.risk is not None:
            self.risk.close()
        if self._writer is not None:
            run = self.run
            self._writer.close(extra=close_extra(self.summary(), run.events, run.continues))
        self.probe.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
