"""The wiring of one guard: what every part works with, built once from ``Guard(...)``'s
arguments (in the order their checks must come: the policy, the model and optimizer,
``sync``, ``qk_layouts``, the folder, the risk source)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from collapse_guard.guard import ddp
from collapse_guard.guard.check import OnceWarnings, check_pair
from collapse_guard.guard.checkpoints import CheckpointRing
from collapse_guard.guard.deferred import DeferredSync, ImmediateSync, make_sync
from collapse_guard.guard.forensics import GradientHistory
from collapse_guard.guard.measure import trainable
from collapse_guard.guard.policy import GuardPolicy
from collapse_guard.guard.preflight import WarmupCheck
from collapse_guard.guard.qk_clip import QKClip, QKMapping
from collapse_guard.guard.record import open_run_writer
from collapse_guard.guard.risk_source import ReadingHold
from collapse_guard.guard.risk_spec import RiskSpec, open_risk
from collapse_guard.guard.state import Training, Trajectory
from collapse_guard.guard.trackers import Trackers, TrackerSpec
from collapse_guard.probe import Probe, ProbeConfig

__all__ = ["GuardSetup", "build_setup"]


@dataclass(frozen=True, eq=False)
class GuardSetup:
    """The guard's collaborators: the parts take this one object, not a list of them."""

    policy: GuardPolicy
    training: Training
    probe: Any
    param_names: tuple[str, ...]  # the trainable parameters' names, in the probe's order
    params: list[torch.Tensor]  # ... and the tensors
    history: GradientHistory  # their gradient norms of the recent steps
    ring: CheckpointRing
    folder: Path
    rank: int
    qk: QKClip | None  # None with GuardPolicy.qk_clip "off"
    once: OnceWarnings
    sync: ImmediateSync | DeferredSync
    run_id: str
    risk: Any  # the risk source (rank 0 alone asks; None: "off")
    hold: ReadingHold  # the levels are for the held risk (risk_source.py)
    writer: Any  # the run file's, None without one
    warmup: WarmupCheck | None
    attention_every: int  # the probe's own attention period (below watch)
    trackers: Trackers  # where the guard's numbers go (trackers.py)
    index: dict[str, int] = field(init=False)  # name -> position in ``params``

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", {n: i for i, n in enumerate(self.param_names)})


def build_setup(
    model: nn.Module,
    optimizer: Any,
    checkpoint_dir: str | os.PathLike,
    policy: GuardPolicy,
    *,
    scaler: Any,
    risk: RiskSpec,
    probe_config: ProbeConfig | Mapping[str, Any] | None,
    run_id: str | None,
    record: bool,
    token: str | None,
    timeout: float | None,
    preflight: bool,
    qk_layouts: QKMapping,
    sync: str,
    trackers: TrackerSpec = None,
) -> tuple[GuardSetup, Trajectory]:
    """A guard's setup and its first trajectory (``Guard``'s arguments)."""
    p = policy
    if isinstance(probe_config, Mapping):
        probe_config = ProbeConfig.from_dict(probe_config)
    probe_config = ProbeConfig(**(probe_config or ProbeConfig()).to_dict())  # our copy
    if isinstance(model, nn.Module) and hasattr(optimizer, "param_groups"):
        check_pair(model, optimizer)  # else the probe says what the type should be
    probe = Probe(model, optimizer, probe_config, scaler=scaler)
    names, params = trainable(model)
    on = p.qk_clip != "off"
    strategy = make_sync(sync, model, optimizer, policy=p, params=params, probe=probe, qk=on)
    qk = QKClip(model, p.qk_clip_tau, qk_layouts, p.qk_clip) if on else None
    folder, rank = Path(checkpoint_dir), ddp.rank()
    ring = CheckpointRing(folder, p.keep_checkpoints)
    if rank == 0:
        ring.clean()  # what killed writes of an earlier process left
    run_id = run_id or uuid.uuid4().hex[:12]
    source, context, window = open_risk(
        risk, token=token, timeout=timeout, run_id=run_id, rank=rank
    )
    history = GradientHistory(names, device=params[0].device if params else None)
    writer = open_run_writer(folder, run_id, p, optimizer) if record and rank == 0 else None
    setup = GuardSetup(
        p, Training(model, optimizer, scaler), probe, names, params, history, ring, folder,
        rank, qk, OnceWarnings(rank), strategy, run_id, source, ReadingHold(), writer,
        WarmupCheck() if preflight else None, probe_config.attention_every,
        Trackers(trackers, p.risk_every),
    )  # fmt: skip
    return setup, Trajectory.fresh(p, window, context)
