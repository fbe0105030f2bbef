"""The guard: observes through its own probe, decides, and acts, inside the user's loop.

The guarded loop, drawn once (``<...>`` marks what ``guard.step`` does, in order)::

    guard = Guard(model, optimizer, checkpoint_dir="ckpt")   # preflight warnings here
    for x, y in guard.batches(loader):        # skips the batches a rescue asked to skip
        for group in optimizer.param_groups:  # (optional: nanoGPT sets the LR itself)
            group["lr"] = lr_at(step)
        logits, loss = model(x, y)
        loss.backward()                       # (scaler.scale(loss).backward() with AMP)
        decision = guard.step(loss)           # replaces clipping and optimizer.step():
            # <CHECK>     the loss is one number; the gradients are this step's (a fresh
            #             backward: else the update is skipped, with one warning)
            # <POLL>      the newest risk answer, if one arrived: level and probability
            # <UNSCALE>   scaler.unscale_(optimizer) when a GradScaler was given (not
            #             if the loop did already: Lightning does, for its clipping hook)
            # <MEASURE>   probe.after_backward(loss); per-tensor gradient norms; one sync
            # <DECIDE>    decision.decide(facts): skip / rescue / level actions (pure)
            # <APPLY>     clip (global, outlier layers), LR x multiplier, optimizer.step()
            #             or not, scaler.update(), the QK-clip rank 0 planned at the
            #             last probe pass (qk_clip.py), probe.after_step(), LR restored
            # <RESCUE>    forensics, roll back to the ring's average, skip batches, cap the LR
            # <RECORD>    the step's row and events into the run file (source "guarded")
            # <KEEP>      a healthy checkpoint when due (every parameter finite; the run
            #             file's rows made durable first); the window to the risk source
        optimizer.zero_grad()
        scheduler.step()                      # any torch scheduler, or none
    guard.close()                             # flushes the run file; idempotent

The probe observes and never acts; every change to training is made here, by the
applier, from a :class:`GuardDecision`. The LR multiplier is set on every parameter
group just before the optimizer step and the loop's own LR is put back right after, so
it holds whether the loop sets ``group["lr"]`` every step or a scheduler does (chainable
schedulers read ``group["lr"]`` and must not see the multiplier).

Host syncs. With ``sync="step"`` (the CPU's default) a step reads its loss and
gradient norm before the update (one sync) and the probe's record after it (one more).
With ``sync="deferred"`` (the default on a GPU with a fused Adam, AdamW or SGD) a healthy
step reads nothing: the device gates the update by the reactive rules
(``device_gate.py``; same rules, same float64 arithmetic, so the same verdict), and the
step's facts and record reach the host through a non-blocking copy that the next step
reads and books (``deferred.py``'s ``_settle``). Steps that still sync, and why
(``_healthy_decision``): a checkpoint (parameters read for finiteness), warn or critical
(outlier layers clipped by their norms), the first step after a rollback and data-fault
mode (their rules read this very loss), layer caps left by a rescue, a forced action,
stale gradients, AMP (the scaler's own skip), the step that applies a QK-clip plan (a
head over tau at the last probe pass; the passes' head maxima travel with the deferred
facts) and DDP (rank 0's decision is broadcast). A rescue found a step late rolls back at
the next step, whose backward is then discarded.
"""

from __future__ import annotations

import math
import numbers
import os
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from collapse_guard.features.ring import SignalRing
from collapse_guard.guard import ddp
from collapse_guard.guard.checkpoints import CheckpointRing, CorruptCheckpoint, save_atomic
from collapse_guard.guard.decision import GuardDecision, StepFacts, decide
from collapse_guard.guard.deferred import DeferredSteps, deferred_sync
from collapse_guard.guard.forensics import GradientHistory
from collapse_guard.guard.policy import RISK_LEVELS, GuardPolicy
from collapse_guard.guard.preflight import WarmupCheck, preflight_warnings
from collapse_guard.guard.qk_clip import QKClip, QKMapping, QKPlan
from collapse_guard.guard.reactive import OnlineLabel, OutlierHistory
from collapse_guard.guard.risk_source import ReadingHold, make_risk_source
from collapse_guard.probe import Probe, ProbeConfig
from collapse_guard.signals import SIGNAL_NAMES

__all__ = ["STATE_VERSION", "Guard", "GuardGaveUp"]

STATE_VERSION = 2  # layout of Guard.state_dict(); bump when a key changes meaning (2: the
# rescue LR factor became a cap, `lr_ceiling`; `run_id`, `loop_lrs`, data-fault mode added)
_FORCEABLE = ("skip", "rescue", "checkpoint")
_DEFAULT_WINDOW = 200  # records kept without a risk model (DESIGN.md's window)
_RECORDED_LOSS_STEPS = 20  # a checkpoint's recorded loss: the mean of this many last losses
# (the label's smoothing time constant is 10 steps: 20 averages out a step's noise)


class GuardGaveUp(RuntimeError):
    """The run kept collapsing after ``GuardPolicy.max_rescues`` rescues."""


class Guard(DeferredSteps):
    """Observe and act: ``decision = guard.step(loss)`` in place of ``optimizer.step()``.

    Args:
        model: the module being trained (a DDP wrapper is fine).
        optimizer: its optimizer.
        checkpoint_dir: folder of the healthy-checkpoint ring, the run file
            (``run-<run_id>.parquet``) and the forensics of rescues.
        scaler: the AMP ``GradScaler``, if any: the guard unscales, steps and updates it.
        risk: None or ``"embedded"`` (the bundled model), ``"off"`` (reactive path
            only), a service URL or a ``RiskClient`` (the embedded model as fallback),
            or a ``RiskModel``.
        config: a :class:`GuardPolicy` or a mapping of its fields.
        probe_config: the owned probe's :class:`ProbeConfig`.
        run_id: the run file's id (default: a fresh uuid); ``record=False``: no run file.
        token, timeout: for a service URL.
        preflight: warn where the set-up is outside the seed's safe ranges.
        qk_layouts: where the q and k heads of attention modules the guard cannot read
            are (``GuardPolicy.qk_clip``): module name -> ``QKLayout``, or a callable
            ``(name, module) -> QKLayout | None``.
        sync: when the host reads a step's loss and gradient norm. ``"step"``: at the
            step, before the update (one sync a step). ``"deferred"``: at the next step;
            the device gates the update by the reactive rules (the optimizer must skip on
            the device: ``fused=True`` Adam, AdamW or SGD), so a healthy step does not
            sync; a rescue then comes one step later. ``"auto"``: deferred for such an
            optimizer on a GPU, else ``"step"`` (on the CPU a read costs no stall).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        checkpoint_dir: str | os.PathLike = "guard-checkpoints",
        *,
        scaler: Any = None,
        risk: Any = None,
        config: GuardPolicy | Mapping[str, Any] | None = None,
        probe_config: ProbeConfig | Mapping[str, Any] | None = None,
        run_id: str | None = None,
        record: bool = True,
        token: str | None = None,
        timeout: float = 2.0,
        preflight: bool = True,
        qk_layouts: QKMapping = None,
        sync: str = "auto",
    ) -> None:
        if isinstance(config, Mapping):
            config = GuardPolicy.from_dict(config)
        self.policy = config or GuardPolicy()
        if not isinstance(self.policy, GuardPolicy):
            raise TypeError(
                f"config must be a GuardPolicy or a mapping, got {type(config).__name__}"
            )
        if isinstance(probe_config, Mapping):
            probe_config = ProbeConfig.from_dict(probe_config)
        probe_config = ProbeConfig(**(probe_config or ProbeConfig()).to_dict())  # our copy
        if isinstance(model, nn.Module) and hasattr(optimizer, "param_groups"):
            _check_pair(model, optimizer)  # else the probe says what the type should be
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.probe = Probe(model, optimizer, probe_config, scaler=scaler)
        self._defer = deferred_sync(sync, model, optimizer)
        self._pending: tuple | None = None  # a deferred step's facts, booked at the next call
        self._discard_next = False  # the rescue of a deferred step: the backward made since
        # ran at the weights it replaced
        self._attention_every = probe_config.attention_every
        on = self.policy.qk_clip != "off"
        self.qk = QKClip(model, self.policy.qk_clip_tau, qk_layouts) if on else None
        # rank 0's plan from the last probe pass, applied after the next update on every
        # rank (it travels with that step's decision): Kimi K2's order, logits measured
        # before an update clip the weights after it
        self.qk_pending: QKPlan = {}
        self.qk_clips = 0  # heads clipped, summed over the run
        self.folder = Path(checkpoint_dir)
        self.rank = ddp.rank()
        self.ring = CheckpointRing(self.folder, self.policy.keep_checkpoints)
        if self.rank == 0:
            self.ring.clean()  # what killed writes of an earlier process left
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.risk = (
            make_risk_source(risk, token=token, timeout=timeout, run_id=self.run_id)
            if self.rank == 0
            else None
        )
        self._hold = ReadingHold()  # the levels are for the held risk (risk_source)
        schema = self.risk.schema if self.risk is not None else None
        self.window_size = schema.window if schema is not None else _DEFAULT_WINDOW
        if schema is not None:
            from collapse_guard.features import RunContext  # numpy only

            self.context = RunContext.from_schema(schema)
        else:
            self.context = None
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.param_names = tuple(n for n, _ in named)
        self._param_index = {n: i for i, n in enumerate(self.param_names)}
        self.params = [p for _, p in named]
        device = self.params[0].device if self.params else None
        self.history = GradientHistory(self.param_names, device=device)
        self._writer = self._open_writer() if record and self.rank == 0 else None
        self._warmup = WarmupCheck() if preflight else None
        self._grad_marks: list[tuple[Any, int]] | None = None  # (weakref, version) per grad
        self._warned: set[str] = set()  # the once-only warnings given
        self._forced: str | None = None
        self._closed = False
        self._reset_trajectory()
        # run state: kept across rollbacks (what the run has learnt about itself)
        self.step_index = 0
        self.level, self.probability, self.risk_source = "ok", math.nan, ""
        self.lr_multiplier = 1.0  # of the level
        self.lr_ceiling = math.inf  # cap on the LR in force (group 0), set by rescues
        self.data_fault = False  # data-fault mode (decision.py)
        self.clean_steps = 0  # non-outlier steps in a row in data-fault mode
        self.after_rollback = False  # the next step runs at weights a rollback restored
        self.averaged_rollback = False  # ... and they are a mean of several checkpoints
        self.loop_lrs: deque[float] = deque(maxlen=2 * self.policy.lr_jump_steps)
        self.continues: dict[str, Any] | None = None  # the run file a resume continues
        self.layer_bounds: dict[str, float] = {}  # tensor -> gradient-norm cap after rescues
        self.pending_skips = 0
        self.skip_streak = self.quiet_steps = 0
        self.last_checkpoint = -(10**9)  # step of the last one; none yet: the first
        # healthy step writes one
        self.rescues = self.skipped = self.checkpoints = 0
        self.events: list[tuple[int, str]] = []
        self.first_warning: int | None = None  # first step at warn or above
        # (window's last step, P(collapse) held over the model's hold_steps)
        self.risk_readings: list[tuple[int, float]] = []
        if preflight and self.rank == 0:
            lrs = [float(g["lr"]) for g in optimizer.param_groups]
            for message in preflight_warnings(model, lrs, self.policy.clip):
                warnings.warn(f"collapse-guard preflight: {message}", UserWarning, stacklevel=2)

    # ------------------------------------------------------------------ state
    def _reset_trajectory(self) -> None:
        """Fresh trajectory state: what a rollback restores from its checkpoint."""
        p = self.policy
        self.loss_history = OutlierHistory(p.outlier_history, p.outlier_min_history)
        self.grad_history = OutlierHistory(p.outlier_history, p.outlier_min_history)
        self.online = OnlineLabel(p.collapse_confirm_steps)
        self.window = SignalRing(self.window_size, SIGNAL_NAMES)  # preallocated: no rows
        # of lists, no DataFrame; scored through the extractor's array path
        self.lr_in_force = math.nan  # group 0's LR at the last applied update
        if self.context is not None:
            self.context.reset()

    def _trajectory_state(self) -> dict[str, Any]:
        return {
            "loss_history": self.loss_history.state_dict(),
            "grad_history": self.grad_history.state_dict(),
            "online": self.online.state_dict(),
            **dict(zip(("window_steps", "window"), self.window.state(), strict=True)),
            "context": self.context.state_dict() if self.context is not None else None,
            "lr_in_force": self.lr_in_force,
        }

    def _load_trajectory(self, state: Mapping[str, Any]) -> None:
        self.loss_history.load_state_dict(state["loss_history"])
        self.grad_history.load_state_dict(state["grad_history"])
        self.online.load_state_dict(state["online"])
        self.window.load(state["window_steps"], state["window"])
        if self.context is not None and state["context"] is not None:
            self.context.load_state_dict(state["context"])
        self.lr_in_force = float(state.get("lr_in_force", math.nan))

    _RUN_KEYS = (
        "step_index",
        "level",
        "probability",
        "lr_multiplier",
        "lr_ceiling",
        "data_fault",
        "clean_steps",
        "after_rollback",
        "averaged_rollback",
        "layer_bounds",
        "pending_skips",
        "rescues",
        "skipped",
        "checkpoints",
        "first_warning",
    )

    def state_dict(self) -> dict[str, Any]:
        """The guard's own state (plain values: loads with ``weights_only=True``)."""
        self._settle()  # a deferred step belongs to the state it left
        run = {key: getattr(self, key) for key in self._RUN_KEYS}
        run["qk_clips"] = self.qk_clips
        run["qk_pending"] = {name: [list(q), list(k)] for name, (q, k) in self.qk_pending.items()}
        run["events"] = [list(e) for e in self.events]
        run["loop_lrs"] = list(self.loop_lrs)
        run["run_id"] = self.run_id  # the run file a resumed run continues
        run["risk_hold"] = self._hold.state_dict()  # a warning held before resuming holds on
        return {"version": STATE_VERSION, "run": run, "trajectory": self._trajectory_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> Guard:
        """Restore :meth:`state_dict` (a resumed run keeps its history); returns self."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"guard state version {state.get('version')!r}, this code reads "
                f"{STATE_VERSION}; resume with the collapse-guard release that saved it"
            )
        self._pending, self._discard_next = None, False  # the state replaces that step
        for key in self._RUN_KEYS:
            setattr(self, key, state["run"][key])
        # absent in checkpoints saved before QK-clip
        self.qk_clips = int(state["run"].get("qk_clips", 0))
        pending = state["run"].get("qk_pending", {})
        self.qk_pending = {n: ([*map(float, q)], [*map(float, k)]) for n, (q, k) in pending.items()}
        self.layer_bounds = dict(self.layer_bounds)
        self.events = [(int(s), str(e)) for s, e in state["run"]["events"]]
        self.loop_lrs.clear()
        self.loop_lrs.extend(float(lr) for lr in state["run"]["loop_lrs"])
        if "risk_hold" in state["run"]:  # absent in checkpoints saved before the hold
            self._hold.load_state_dict(state["run"]["risk_hold"])
        self._load_trajectory(state["trajectory"])
        self.probe.step = self.step_index
        return self

    def resume(self, path: str | os.PathLike | None = None) -> int:
        """Load model, optimizer, scaler and guard state from a ring checkpoint (default:
        the newest in ``checkpoint_dir``); returns the step to continue from.

        The guard's history (events, outlier histories, risk window, LR cap, rescues)
        comes back with it. The resumed run records into its own, new run file (a
        finished Parquet file cannot be appended to): its rows go on from the returned
        step, and its metadata names the run it continues (``extra["continues"]``: the
        previous ``run_id``, the step and the checkpoint), so the two files read
        end to end are the whole run.
        """
        from collapse_guard.guard.checkpoints import load_verified

        if path is not None:
            state = load_verified(path)  # the one asked for, or a CorruptCheckpoint naming it
        else:
            path, state, skipped = self.ring.newest_valid(tidy=self.rank == 0)
            if skipped:
                warnings.warn(
                    f"collapse-guard resume: skipped {len(skipped)} damaged checkpoint(s) in "
                    f"{self.folder} (renamed *.corrupt): {'; '.join(skipped)}; resuming from "
                    f"{path.name if path else 'none'}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            if path is None and skipped:
                raise CorruptCheckpoint(
                    f"no valid guard checkpoint in {self.folder} to resume from (skipped: "
                    f"{'; '.join(skipped)})",
                    "start the run afresh, or point checkpoint_dir at the run's folder",
                )
            if path is None:
                raise FileNotFoundError(f"no guard checkpoint in {self.folder} to resume from")
        self.ring.adopt(Path(path), tidy=self.rank == 0)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.load_state_dict(state["guard"])
        self.last_checkpoint = self.step_index - 1  # the state after that step
        self.continues = {
            "run_id": state["guard"]["run"]["run_id"],
            "step": self.step_index,
            "checkpoint": Path(path).name,
        }
        if self._writer is not None:  # lineage on disk from the first chunk, not at close
            self._writer.update_meta(extra={"continues": self.continues})
        self._log(self.step_index, [f"resume:{Path(path).name}"])
        return self.step_index

    # --------------------------------------------------------------- batches
    def should_skip_batch(self) -> bool:
        """True while a rescue asks to skip batches (each call consumes one)."""
        if self.pending_skips > 0:
            self.pending_skips -= 1
            return True
        return False

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """``loader``'s batches, less those a rescue asked to skip."""
        for batch in loader:
            if not self.should_skip_batch():
                yield batch

    def force_next(self, action: str) -> None:
        """Make the next step ``"skip"``, ``"rescue"`` or ``"checkpoint"`` (tests, drills)."""
        if action not in _FORCEABLE:
            raise ValueError(f"action must be one of {_FORCEABLE}, got {action!r}")
        self._forced = action

    # ------------------------------------------------------------------ step
    def step(self, loss: torch.Tensor | float) -> GuardDecision:
        """Measure, decide and act for one optimizer step (module docstring).

        A deferred step (``sync="deferred"``) returns the decision its healthy facts give;
        the decision it is booked with (events, run file) is made at the next call.
        """
        if self._closed:
            raise RuntimeError("guard.step() after guard.close(); create a new Guard")
        loss_t = _scalar_loss(loss)
        self._settle()  # the last step's facts, if it was deferred: before anything reads state
        s = self.step_index
        stale = self._stale_gradients()  # before unscale_, which writes the gradients
        if self._discard_next and not stale:
            stale = "after_rescue"  # this backward ran at the weights the rollback replaced
        self._discard_next = False
        self.loop_lrs.append(float(self.optimizer.param_groups[0]["lr"]))
        self._poll_risk()
        if self.scaler is not None and self.scaler.is_enabled() and not self._unscaled():
            self.scaler.unscale_(self.optimizer)
        healthy = self._healthy_decision(s, stale)
        self.probe.host_reads = healthy is None
        self.probe.after_backward(loss)
        norms = self._tensor_norms()
        total = torch.linalg.vector_norm(norms) if len(norms) else torch.zeros(())
        if healthy is not None:
            decision = healthy
            self._apply_deferred(healthy, loss_t, total, norms)
        else:
            loss_value, grad_norm = _host_floats(loss_t, total)  # the step's sync
            if not stale and grad_norm == 0.0:  # zero_grad() and no backward, or a loss
                stale = "zero_gradients"  # that depends on no parameter
            if stale and stale != "after_rescue":
                self._warn_stale(stale)
            decision, qk_plan = ddp.share(
                (self._decide(s, loss_value, grad_norm, norms, stale), self.qk_pending)
                if self.rank == 0
                else None
            )
            self._apply(decision, grad_norm, norms, qk_plan)
        self._grad_marks = [
            (weakref.ref(p.grad), p.grad._version) if p.grad is not None else (None, 0)
            for p in self.params
        ]
        return decision

    def _stale_gradients(self) -> str:
        """Why the gradients cannot be this step's ("" when they are fresh): none at all,
        or the very tensors of the last step, unchanged (``guard.step`` twice per backward)."""
        grads = [p.grad for p in self.params]
        if all(g is None for g in grads):
            return "no_gradients"
        marks = self._grad_marks
        if marks is None or len(marks) != len(grads):
            return ""
        for grad, (ref, version) in zip(grads, marks, strict=True):
            if grad is None:
                if ref is not None:
                    return ""
            elif ref is None or ref() is not grad or grad._version != version:
                return ""
        return "same_gradients"

    def _warn_stale(self, why: str) -> None:
        if why in self._warned or self.rank != 0:
            return
        self._warned.add(why)
        text = {
            "no_gradients": "every parameter's .grad is None: loss.backward() was not called",
            "same_gradients": "the gradients are those of the last guard.step (no backward() "
            "since): guard.step was called twice for one backward",
            "zero_gradients": "every gradient is exactly zero: zero_grad() ran but no "
            "backward() after it, or the loss does not depend on the model's parameters",
        }[why]
        warnings.warn(
            f"collapse-guard: step {self.step_index}: {text}. The update is skipped (event "
            f"skip:{why}); call loss.backward() once, then guard.step(loss) once, per batch. "
            "This warning is given once.",
            RuntimeWarning,
            stacklevel=3,
        )

    def _poll_risk(self) -> None:
        reading = self.risk.poll() if self.risk is not None else None
        if reading is None:
            return
        reading = self._hold(reading)
        self.level, self.probability = reading.level, reading.probability
        self.risk_source = reading.source
        self.risk_readings.append((reading.step, reading.probability))
        if self.first_warning is None and reading.level in ("warn", "critical"):
            self.first_warning = self.step_index
        elevated = reading.level != "ok"
        self.probe.config.attention_every = (
            self.policy.watch_attention_every if elevated else self._attention_every
        )

    def _tensor_norms(self) -> torch.Tensor:
        """Every trainable tensor's gradient norm (0 without a gradient), on the device:
        the probe's, from its one pass over the gradients, where it measured them."""
        shared = self.probe.tensor_norms
        if shared is not None and len(shared) == len(self.params):
            return shared
        grads = [p.grad for p in self.params]
        present = [g for g in grads if g is not None]
        if not present:
            return torch.zeros(len(grads))
        norms = iter(torch._foreach_norm(present))
        device = present[0].device
        return torch.stack(
            [
                next(norms).float().to(device) if g is not None else torch.zeros((), device=device)
                for g in grads
            ]
        )

    def _lr_jumped(self) -> bool:
        """The loop's LR rose over lr_jump_ratio within the last lr_jump_steps steps."""
        n = self.policy.lr_jump_steps
        if len(self.loop_lrs) <= n:
            return False
        lrs = list(self.loop_lrs)
        return max(lrs[-n:]) > self.policy.lr_jump_ratio * max(lrs[:-n])

    def _decide(
        self, s: int, loss_value: float, grad_norm: float, norms: torch.Tensor, stale: str = ""
    ) -> GuardDecision:
        if not self.data_fault and not stale:  # in data-fault mode only applied steps count
            self.online.update(s, loss_value)
        elevated = self.level in ("warn", "critical")
        outliers = self.history.outliers(norms, self.policy.layer_outlier_ratio) if elevated else {}
        facts = self._facts(s, loss_value, grad_norm, tuple(outliers), stale)
        decision = decide(facts, self.policy)
        decision = self._forced_decision(decision)
        if decision.checkpoint and not decision.rescue:
            decision = self._checkable(decision)
        if decision.rescue:
            p = self.policy
            paths = tuple(str(x) for x in self.ring.basin(p.average_span, p.average_loss_gap))
            if decision.reason.startswith("average_worse"):
                paths = paths[-1:]  # the newest checkpoint alone: weights measured healthy
            decision = replace(decision, rollback_to=paths)
        return decision

    def _facts(
        self,
        s: int,
        loss_value: float,
        grad_norm: float,
        outliers: tuple[str, ...] = (),
        stale: str = "",
    ) -> StepFacts:
        return StepFacts(
            step=s,
            loss=loss_value,
            grad_norm=grad_norm,
            grad_finite=math.isfinite(grad_norm),
            loss_z=self.loss_history.z(loss_value),
            grad_z=self.grad_history.z(grad_norm),
            level=self.level,
            probability=self.probability,
            lr_multiplier=self.lr_multiplier,
            skip_streak=self.skip_streak,
            collapse_online=self.online.collapsed(s),
            rescues=self.rescues,
            layer_outliers=outliers,
            since_checkpoint=s - self.last_checkpoint,
            quiet_steps=self.quiet_steps,
            amp_overflow=self._amp_overflow(),
            lr_jump=self._lr_jumped(),
            after_rollback=self.after_rollback,
            averaged_rollback=self.averaged_rollback,
            data_fault=self.data_fault,
            clean_steps=self.clean_steps,
            stale_gradients=stale,
        )

    def _checkable(self, decision: GuardDecision) -> GuardDecision:
        """``decision`` without its checkpoint where a parameter is not finite: a NaN in a
        tensor the forward never reads (an unused embedding row) harms no loss, so no other
        rule sees it, but it must not go into a "healthy" checkpoint. One foreach pass and
        one sync, at checkpoint steps only."""
        norms = torch._foreach_norm([p.detach() for p in self.params])
        device = norms[0].device
        finite = torch.isfinite(torch.stack([n.float().to(device) for n in norms])).cpu()
        if bool(finite.all()):
            return decision
        name = self.param_names[int((~finite).nonzero()[0])]
        if "nonfinite_param" not in self._warned:
            self._warned.add("nonfinite_param")
            warnings.warn(
                f"collapse-guard: step {decision.step}: parameter {name!r} holds NaN or inf; "
                "no healthy checkpoint is written while it does (event "
                "checkpoint_refused:nonfinite_param). A tensor the forward never reads gets "
                "no gradient, so nothing in training repairs it: find what wrote it. This "
                "warning is given once.",
                RuntimeWarning,
                stacklevel=4,
            )
        events = tuple(
            f"checkpoint_refused:nonfinite_param={name}" if e == "checkpoint" else e
            for e in decision.events
        )
        return replace(decision, checkpoint=False, events=events)

    def _forced_decision(self, decision: GuardDecision) -> GuardDecision:
        forced, self._forced = self._forced, None
        if forced == "skip":
            return replace(
                decision,
                apply_update=False,
                reason="forced",
                events=(*decision.events, "skip:forced"),
            )
        if forced == "rescue":
            return replace(
                decision,
                apply_update=False,
                rescue=True,
                reason="forced",
                events=(*decision.events, "rescue:forced"),
            )
        if forced == "checkpoint":
            return replace(decision, checkpoint=True, events=(*decision.events, "checkpoint"))
        return decision

    def _unscaled(self) -> bool:
        """The scaler already unscaled this step's gradients (unscaling twice is an error)."""
        state = self.scaler._per_optimizer_states.get(id(self.optimizer), {})
        return getattr(state.get("stage"), "name", "") == "UNSCALED"

    def _amp_overflow(self) -> bool:
        if self.scaler is None or not self.scaler.is_enabled():
            return False
        state = self.scaler._per_optimizer_states.get(id(self.optimizer), {})
        found = state.get("found_inf_per_device", {})
        return bool(sum(v.item() for v in found.values()))  # sync only under AMP

    # ----------------------------------------------------------------- apply
    def _apply(
        self, decision: GuardDecision, grad_norm: float, norms: torch.Tensor, qk_plan: QKPlan
    ) -> None:
        """Execute ``decision`` (and rank 0's QK-clip plan): the only place where the guard
        changes training."""
        if decision.give_up:
            self._give_up(decision)
        self.lr_multiplier = decision.lr_multiplier
        if decision.reason != "after_rescue":  # that step trained nothing: the next one is
            self.after_rollback = False  # the first at the restored weights
        saved = None
        if decision.apply_update and not decision.rescue:
            self._clip(decision, grad_norm, norms)
            saved = self._lr_with_multiplier(decision)
            if self.scaler is not None and self.scaler.is_enabled():
                self.scaler.step(self.optimizer)
            else:
                self.optimizer.step()
        if self.scaler is not None and self.scaler.is_enabled():
            self.scaler.update()
        clipped = self.qk.apply(qk_plan) if self.qk and qk_plan and not decision.rescue else []
        record = self.probe.after_step()  # `lr` is the LR in force, multiplier included
        self.qk_pending = self._qk_plan(decision)
        if saved is not None:
            self._restore_lr(saved)
        self._book(decision, norms, record, clipped)

    def _give_up(self, decision: GuardDecision) -> None:
        s = self.step_index
        self._log(s, decision.events)
        self.close()
        raise GuardGaveUp(
            f"step {s}: the run collapsed again ({decision.reason}) after "
            f"{self.rescues} rescues (GuardPolicy.max_rescues={self.policy.max_rescues}); "
            f"stopping instead of looping. Forensics of each rescue are in {self.folder}/"
            "forensics; lower the LR, check the data (a loss that rises again after every "
            "rollback can be the data going bad), or raise max_rescues to keep trying"
        )

    def _lr_with_multiplier(self, decision: GuardDecision) -> list[float]:
        """Set every group's LR to the loop's x the level's multiplier (under the rescues'
        cap) for the optimizer step; returns the loop's LRs, to put back after it."""
        saved = [group["lr"] for group in self.optimizer.param_groups]
        factor = decision.lr_multiplier
        if saved[0] * factor > self.lr_ceiling:  # the cap of the rescues
            factor = self.lr_ceiling / saved[0]
        self.lr_in_force = saved[0] * factor
        for group, lr in zip(self.optimizer.param_groups, saved, strict=True):
            group["lr"] = lr * factor
        return saved

    def _restore_lr(self, saved: list[float], warmup: bool = True) -> None:
        for group, lr in zip(self.optimizer.param_groups, saved, strict=True):
            group["lr"] = lr
        if warmup:
            self._check_warmup(saved[0])

    def _check_warmup(self, lr: float) -> None:
        warning = self._warmup.add(lr) if self._warmup is not None else None
        if warning and self.rank == 0:
            warnings.warn(f"collapse-guard preflight: {warning}", UserWarning, stacklevel=4)

    def _book(
        self, decision: GuardDecision, norms: torch.Tensor, record: dict, clipped: list[str]
    ) -> None:
        """What follows the update: history, counts, the rescue, the run file's row, the
        checkpoint and the risk request of step ``step_index``, which then moves on."""
        s = self.step_index
        # the step's norms join the history now: the decision and the clipping judged them
        # against the steps before; the forensics of a rescue include them
        self.history.add(s, norms)
        events = [*decision.events, *clipped]
        self.qk_clips += len(clipped)
        self._count(decision, record)
        if decision.rescue:
            events += self._rescue(decision, norms)
        self._log(s, events)
        if self._writer is not None:
            self._writer.append(s, record, event=";".join(events))
        self.step_index += 1  # a checkpoint holds the state *after* step s: resume at s + 1
        if decision.checkpoint and not decision.rescue:
            self._checkpoint()
        if self.risk is not None and (s + 1) % self.policy.risk_every == 0 and len(self.window):
            self.risk.submit(s, self.window.window(), self.context.get())

    def _qk_plan(
        self, decision: GuardDecision, maxima: Mapping[str, np.ndarray] | None = None
    ) -> QKPlan:
        """Rank 0's QK-clip plan from this step's probe pass ({} without one, after a
        rescue, whose rollback replaces the weights the pass read, or below the mode's
        level); ``maxima``: its head maxima, read by a deferred step's copy."""
        probe_pass = self.probe.last_pass
        if self.qk is None or self.rank != 0 or probe_pass is None or decision.rescue:
            return {}
        if self.policy.qk_clip == "watch" and RISK_LEVELS.index(decision.level) < 1:
            return {}
        if self.policy.qk_clip == "rescue" and not self.rescues:
            return {}
        return self.qk.plan(probe_pass.attention, maxima)

    def _clip(self, decision: GuardDecision, grad_norm: float, norms: torch.Tensor) -> None:
        bounds = dict(self.layer_bounds)
        if decision.clip_layers:
            medians = self.history.outliers(norms, self.policy.layer_outlier_ratio)
            for name in decision.clip_layers:
                if name in medians:
                    bounds.setdefault(name, self.policy.layer_outlier_ratio * medians[name])
        clipped = False
        for name, bound in bounds.items():
            i = self._param_index.get(name)
            grad = self.params[i].grad if i is not None else None
            if grad is not None:
                norm = float(norms[i])
                if norm > bound:
                    grad.mul_(bound / (norm + 1e-6))
                    clipped = True
        if decision.clip_to > 0:
            grads = [p.grad for p in self.params if p.grad is not None]
            if clipped:  # the layer clipping changed the norm: measure it again
                torch.nn.utils.clip_grad_norm_(self.params, decision.clip_to, foreach=True)
            elif grad_norm > decision.clip_to:
                torch._foreach_mul_(grads, decision.clip_to / (grad_norm + 1e-6))

    def _count(self, decision: GuardDecision, record: dict[str, float]) -> None:
        s = self.step_index
        applied = decision.apply_update and not decision.rescue
        if applied:
            self.skip_streak = 0
            self.loss_history.add(record["loss"])
            self.grad_history.add(record["grad_norm"])
            if self.data_fault:  # the online label sees only the batches trained on
                self.online.update(s, record["loss"])
        elif not decision.rescue:
            self.skip_streak += 1
            self.skipped += 1
        self.clean_steps = self.clean_steps + 1 if self.data_fault and applied else 0
        self.data_fault = decision.data_fault
        open_excursion = self.online.open_for(s) > 0
        calm = applied and not open_excursion and decision.level != "critical"
        self.quiet_steps = self.quiet_steps + 1 if calm else 0
        if not decision.rescue:
            self.window.append(s, [record[k] for k in SIGNAL_NAMES])
            if self.context is not None:
                self.context.update(s, record)

    def _log(self, s: int, events: Iterable[str]) -> None:
        self.events.extend((s, e) for e in events)

    # ------------------------------------------------------ checkpoint, rescue
    def _full_state(self) -> dict[str, Any]:
        recent = list(self.loss_history.values)[-_RECORDED_LOSS_STEPS:]
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "guard": self.state_dict(),
            # the ring's basin test (checkpoints.py) reads it from the sidecar
            "loss": sum(recent) / len(recent) if recent else math.nan,
        }

    def _checkpoint(self) -> None:
        if self.rank == 0:
            if self._writer is not None:  # the rows up to a checkpoint are durable before it
                self._writer.flush()
            self.ring.save(self.step_index, self._full_state())
        self.checkpoints += 1
        self.last_checkpoint = self.step_index - 1  # called after step_index moved on

    def _rescue(self, decision: GuardDecision, norms: torch.Tensor) -> list[str]:
        """Forensics, rollback to the ring's average, skips, a lower LR, layer caps."""
        s, p = self.step_index, self.policy
        events = []
        blown = self.history.outliers(norms, p.layer_outlier_ratio, min_rows=1)
        if self.rank == 0:
            folder = self.folder / "forensics" / f"step-{s:09d}"
            current = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
            save_atomic({"format": 1, "step": s, **current}, folder / "state.pt")
            self.history.save(folder, blown)
            events.append(f"forensics:{folder.name}")
        healthy_lr = self.lr_in_force  # without a checkpoint: the LR of the last update
        self.averaged_rollback = False
        if decision.rollback_to:
            state = self.ring.rollback_state(decision.rollback_to)
            lrs = [g["lr"] for g in self.optimizer.param_groups]  # the loop's LR stays
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            self._load_trajectory(state["guard"]["trajectory"])
            healthy_lr = self.lr_in_force  # the newest checkpoint's
            self.averaged_rollback = state["averaged"] > 1
            self.probe.reset()  # the rollback is not an update: forget the previous sketch
            events.append(f"rollback:avg{state['averaged']}@{state['step']}")
            ddp.barrier()  # every rank has read the files before rank 0 may replace them
        else:
            self._reset_trajectory()
            events.append("rollback:none")
        self.after_rollback = True
        self.rescues += 1
        self.skip_streak = self.quiet_steps = 0
        if decision.reason.startswith("average_worse"):  # a correction of the last rescue:
            return events  # its LR cap and batch skips stand, none added
        if math.isfinite(healthy_lr):
            developed = decision.reason == "online_collapse"
            factor = p.developed_rescue_lr if developed else p.rescue_lr
            self.lr_ceiling = factor * min(self.lr_ceiling, healthy_lr)
        self.pending_skips += p.skip_batches
        for name, median in blown.items():
            self.layer_bounds[name] = p.rescue_layer_clip * median
        events += [f"skip_batches:{p.skip_batches}", f"lr_ceiling:{self.lr_ceiling:.3g}"]
        if blown:
            events.append(f"layer_caps:{len(blown)}")
        return events

    # ----------------------------------------------------------------- close
    def _open_writer(self):
        from collapse_guard.datasets.runfile import RunMeta  # pandas, pyarrow: lazily
        from collapse_guard.probe.recorder import open_writer

        config = {"policy": self.policy.to_dict(), "optimizer": type(self.optimizer).__name__}
        meta = RunMeta(run_id=self.run_id, source="guarded", config=config)
        return open_writer(self.folder / f"run-{self.run_id}.parquet", meta)

    def summary(self) -> dict[str, Any]:
        """Counts of what the guard did (also the run file's ``extra["guard"]``)."""
        return {
            "steps": self.step_index,
            "skipped": self.skipped,
            "rescues": self.rescues,
            "checkpoints": self.checkpoints,
            "first_warning": self.first_warning,
            "lr_ceiling": self.lr_ceiling,
            "risk_source": self.risk_source,
            "qk_clips": self.qk_clips,
        }

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
            events = [f"{s}:{e}" for s, e in self.events[-1000:]]
            extra = {"guard": {**self.summary(), "events": events}}
            if self.continues is not None:
                extra["continues"] = self.continues
            self._writer.close(extra=extra)
        self.probe.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _scalar_loss(loss: Any) -> torch.Tensor:
    """The loss as a 0-d float tensor, or a clear error: the guard reads one number."""
    if torch.is_tensor(loss):
        if loss.numel() != 1:
            raise ValueError(
                f"guard.step(loss): the loss must be a scalar tensor (one number), got a "
                f"tensor of shape {tuple(loss.shape)}; reduce it first, e.g. "
                "guard.step(loss.mean()) (and call backward() on that same scalar)"
            )
        return loss.detach().float().reshape(())
    if isinstance(loss, numbers.Real) and not isinstance(loss, bool):
        return torch.tensor(float(loss))
    raise TypeError(
        f"guard.step(loss): the loss must be a scalar tensor (or a number), got "
        f"{type(loss).__name__} {loss!r:.60}; pass the tensor you called backward() on"
    )


def _host_floats(*values: torch.Tensor) -> list[float]:
    """0-d tensors as floats: one copy to the host for a device's, ``float`` on the CPU
    (no device to wait for; a stack and copies cost ~20 us there)."""
    if all(v.device.type == "cpu" for v in values):
        return [float(v) for v in values]
    return torch.stack([v.cpu() for v in values]).tolist()


def _check_pair(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer must update this model's parameters: the guard measures, clips and
    rolls back the model's, and an optimizer of another model would train unguarded."""
    mine = {id(p) for p in model.parameters()}
    if not mine:
        raise ValueError(
            f"Guard: the model ({type(model).__name__}) has no parameters, so there is "
            "nothing to guard; pass the module whose parameters the optimizer updates"
        )
    theirs = [p for group in optimizer.param_groups for p in group["params"]]
    if theirs and not any(id(p) in mine for p in theirs):
        raise ValueError(
            f"Guard: none of the optimizer's {len(theirs)} parameters belong to the model "
            f"({type(model).__name__}, {len(mine)} parameter tensors): the optimizer was "
            "built for another model; build it from this one, e.g. "
            "AdamW(model.parameters())"
        )
    outside = sum(id(p) not in mine for p in theirs)
    if outside:
        warnings.warn(
            f"collapse-guard: {outside} of the optimizer's {len(theirs)} parameters are not "
            "the model's: the guard neither measures nor rolls them back",
            UserWarning,
            stacklevel=3,
        )
