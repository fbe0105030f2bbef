"""Rescue benchmark: configurations that collapse unguarded, trained by every arm below.

Issue 10 asks for 30+ seeded configurations from the real-run sampler that collapse
unguarded, half whose collapse develops over 50+ steps after its trigger and half
sudden (within 10 steps: an LR jump, a 1-5 step re-warm, a gradient spike, corrupted
batches), and the share that finish healthy under the guard, their final loss against
the same configuration at a safe LR, the steps lost to rollbacks, compared with the
OLMo-core skip-step rule and ZClip alone. Issue 24 adds per-head QK-clip (with the
guard, and alone as Kimi K2's rule), the cheaper rescues, and configurations of model
families drawn part by part (``family="drawn"``).

Configurations, from any of:

* ``--sweep DIR``: a finished sweep of ``collapse-guard data real`` (run ``i`` =
  ``sample_config(seed, i, steps)``; its metadata holds the label, the onset kind and
  the trigger distance), so no run is spent finding collapses: ``develops`` = onset 50+
  steps after its latest trigger, ``sudden`` = under 10. Within each half the
  configurations are taken round-robin over their mechanism (recipe, or fault /
  re-warm for the sudden ones), in index order, so that no one mechanism fills a half.
* ``--only I ...`` without a sweep on disk: ``sample_config(seed, I, steps)`` for each
  index; the unguarded arm is trained here and its own onset gives the half.
* ``--drawn-adamw I ...``: issue 24's AdamW set-ups on architectures drawn part by
  part (``family="drawn"``): AdamW (0.9, 0.95), weight decay 0.1, the sampler's
  ``constant_high`` (a long warmup to a constant LR 2-6x the edge; every odd index
  decays by cosine to 0.1x instead: ``cosine_high``) and ``slow_ramp`` (learn at a safe
  LR, re-warm over 100-300 steps to 2-4x the edge); named ``adamw-III``, their half
  from the unguarded arm's run. Not every one collapses: those that do not are no
  collapse to rescue and are left out of the tables.
* ``--breadth I ...``: runs of the breadth sweep (``collapse-guard data real --sweep
  breadth``) by index, drawn without their files; the unguarded arm is trained here.
* ``--runs DIR``: the collapsed run files in DIR (``--runs-optimizer`` narrows them),
  each replayed from the config its metadata holds; its half from that metadata.

A collapse 10-49 steps after its trigger belongs to neither half (``between``): it is
reported in its own row, never picked from a sweep.

Arms (one run each, the loop of ``runner.train``: nanoGPT's, LR set every step, the
fault hooks in their places):

====================  ================================================================
arm                   what
====================  ================================================================
``unguarded``         the configuration as drawn; read from its run file where there is
                      one (``--rerun-unguarded`` trains it again: the loop below,
                      without the probe, reproduces the sweep; checked on index 48)
``guarded``           ``collapse_guard.demo.run_scenario``: ``Guard`` with the bundled
                      model (``RiskModel.load()``), policy defaults (QK-clip
                      ``"always"`` at tau 100 since issue 24), clipping at the config's own
``guarded_no_qk``     the same with ``qk_clip="off"`` (the default before issue 24)
``guarded_qk_watch``  the same with ``qk_clip="watch"``
``qk_alone``          QK-clip alone at tau 100, Kimi K2's rule
                      (``reference_rules.KimiClip``): the probe's attention pass every
                      10 steps (the guard's cadence) gives each head's largest logit,
                      the heads over tau are scaled at once
``safe_lr``           every LR capped at ``SAFE_SHARE`` x the family/optimizer's
                      ``STABLE_EDGE`` (the top of the sampler's ``baseline`` range,
                      healthy in every baseline run): peak LR and re-warm LR capped, LR
                      faults dropped; data and gradient faults kept
``olmo``              OLMo-core's skip-step rule alone (``reference_rules.OLMoSkip``)
``zclip``             ZClip alone (``reference_rules.ZClip``), the config's own
                      clipping kept
``newest``            ``guarded`` rolling back to the newest healthy checkpoint alone
                      (``average_span=0``) instead of the mean of its basin
``rescue_qk``         ``guarded`` with QK-clip from the first rescue on
                      (``qk_clip="rescue"``) and the weakest LR cap the policy allows
                      after every rescue (1x: the LR of the checkpoint rolled back to)
``rescue_both``       QK-clip from the first rescue on and a 0.5x cap after every rescue
``rescue_quarter``    ``guarded`` with a 0.25x cap after every rescue
``rescue_developed``  0.25x after a collapse that developed (``developed_rescue_lr``: an
                      ``online_collapse`` rescue), 0.5x after a non-finite loss or an LR
                      jump: the default since ``developed_rescue_lr`` is 0.25 (then it is
                      ``guarded``'s run)
``reactive_only``     ``guarded`` with the forecast's actions off (``forecast_actions=
                      False``): no LR cut, tighter clip or outlier bound at warn or
                      critical; the reactive rules, rescues and checkpoints as they are
``guarded_scale``     ``guarded`` halving the LR at warn instead of holding it
                      (``warn_action="scale"``: the default before the 640-run model;
                      ``guarded_hold`` in the results of 2026-12-03, when it was the arm)
``lifting``           ``guarded`` with the rescue's cap lifting (``lr_lift_steps=20``:
                      1.5x per 20 healthy steps, falling back on a precursor or warn)
``lifting_slow``      the same, slower: 1.25x per 60 healthy steps
``skip_z6``           ``guarded`` with OLMo-core's outlier bound, z = 6 (``outlier_z``; 10
                      by default since issue 32): it skips every batch the default skips
                      and more, so it runs on every configuration
``warn_quarter``      ``guarded_scale`` with a quarter of the LR at warn (``warn_lr=0.25``)
``warn_quarter_slow`` the same, the multiplier doubling back every 300 steps once the
                      risk falls (``lr_restore_steps=300``) instead of 100
``hold_watch``        ``guarded`` whose hold at warn lifts only once the risk is under
                      watch (``hold_release="watch"``: an alarm's hysteresis), not under
                      warn
``warn_fall``         ``guarded`` whose hold, met by a precursor of the loss, caps the
                      LR at a quarter of the held LR for good, without a rollback
                      (``warn_fall=0.25``, ``warn_rescue=False``)
``warn_fall_half``    the same at half the held LR (``warn_fall=0.5``)
``hold_waits``        ``guarded`` whose hold, met by a precursor of the loss, waits for the
                      online label's rescue (``warn_rescue=False``: the rule before
                      2026-12-06 17:39)
``developed_half``    ``guarded`` with a 0.5x cap after a collapse that developed
                      (``developed_rescue_lr=0.5``)
``cap_still``         ``guarded`` with the rescue's cap of before 2026-12-06: it stands
                      still as the loop's LR decays, and 0.5x after an LR jump
                      (``cap_follows_schedule=False``, ``jump_rescue_lr=0.5``)
``no_rewind``         ``guarded`` whose rescues roll back to the ring alone, never to the
                      lowest-loss checkpoint past it (``rewind_loss_gap=0``)
====================  ================================================================

Every arm is labelled on its own losses (``label_run``). **Saved** = "healthy" (no
collapse, the guard did not give up) *and* trained below its data's bigram entropy
(``bigram_entropy``: the conditional entropy of the next token given this one over the
whole token stream; the best 20-step mean loss must be under it): a run that never
learns more than one token of context is not a rescue. The final loss is the mean of
the last 20 finite losses. A run whose loss stays non-finite for
``NONFINITE_PATIENCE`` steps is stopped (as the sweep's runner does).

Resumable: each finished (configuration, arm) is one JSON line in ``--out``/results.jsonl
(its losses included); a rerun skips those already there. The guard's arms are keyed by
a hash of the guard's code (``collapse_guard/guard/*.py`` and ``demo.py``, docstrings and
comments left out) and of the bundled model, so a change to either reruns only them.
``--report-only`` prints the tables from the file.

Usage::

    OMP_WAIT_POLICY=passive nice -n 10 python benchmarks/guard_rescue.py \\
        --only 1 9 11 --runs /root/cg-data/issue20/drawn-mix --runs-optimizer adamw \\
        --out /root/cg-data/rescue24 --workers 2 --arms unguarded guarded safe_lr
    python benchmarks/guard_rescue.py --sweep /nonexistent --drawn-adamw 0 9 \
        --out /root/cg-data/rescue24 --by-config --arms unguarded guarded guarded_no_qk
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import math
import re
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict, deque
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

import rescue_tables as tables
from reference_rules import QK_TAU, KimiClip, OLMoSkip, ZClip

__all__ = [
    "bigram_entropy",
    "drawn_adamw_cases",
    "label_losses",
    "main",
    "pick_configs",
    "result_row",
    "safe_config",
    "token_entropy",
]

# the guard's arms: GuardPolicy fields over the demo's own (module docstring)
GUARD_POLICIES = {
    "guarded": {},
    "guarded_no_qk": {"qk_clip": "off"},
    "guarded_qk_watch": {"qk_clip": "watch"},
    "newest": {"average_span": 0},
    "rescue_qk": {"qk_clip": "rescue", "rescue_lr": 1.0, "developed_rescue_lr": 1.0},
    "rescue_both": {"qk_clip": "rescue", "developed_rescue_lr": 0.5},
    "rescue_quarter": {"rescue_lr": 0.25, "developed_rescue_lr": 0.25},
    "rescue_developed": {"developed_rescue_lr": 0.25},
    "reactive_only": {"forecast_actions": False},
    "guarded_scale": {"warn_action": "scale"},
    "hold_watch": {"hold_release": "watch"},
    "lifting": {"lr_lift_steps": 20},
    "lifting_slow": {"lr_lift_steps": 60, "lr_lift": 1.25},
    "warn_quarter": {"warn_action": "scale", "warn_lr": 0.25},
    "warn_quarter_slow": {"warn_action": "scale", "warn_lr": 0.25, "lr_restore_steps": 300},
    "skip_z6": {"outlier_z": 6.0},
    "warn_fall": {"warn_fall": 0.25, "warn_rescue": False},
    "warn_fall_half": {"warn_fall": 0.5, "warn_rescue": False},
    "developed_half": {"developed_rescue_lr": 0.5},
    "hold_waits": {"warn_rescue": False},
    "cap_still": {"cap_follows_schedule": False, "jump_rescue_lr": 0.5},
    "no_rewind": {"rewind_loss_gap": 0.0},
}
PLAIN_ARMS = ("unguarded", "qk_alone", "safe_lr", "olmo", "zclip")
ARMS = ("unguarded", "guarded", "guarded_no_qk", "guarded_qk_watch", "qk_alone", "safe_lr")
ARMS += ("olmo", "zclip", "newest", "rescue_qk", "rescue_both", "rescue_quarter")
ARMS += ("rescue_developed", "reactive_only", "guarded_scale", "lifting", "lifting_slow")
ARMS += ("warn_quarter", "warn_quarter_slow", "skip_z6", "hold_watch", "warn_fall", "cap_still")
ARMS += ("warn_fall_half", "developed_half", "hold_waits", "no_rewind")
HALVES = ("develops", "sudden", "between")
# the arms that differ from guarded only from an event on (same_as_guarded): a first
# rescue, a first warn
CAP_ARMS = ("rescue_quarter", "rescue_developed", "lifting", "lifting_slow", "cap_still")
CAP_ARMS += ("developed_half", "no_rewind")
FORECAST_ARMS = ("reactive_only", "guarded_scale", "warn_quarter", "warn_quarter_slow")
FORECAST_ARMS += ("hold_watch", "warn_fall", "warn_fall_half", "hold_waits")
# the forecast's worth (issue 32): each arm's steps lost and final loss against another's
PAIRS = (
    ("guarded", "reactive_only"),
    ("guarded_scale", "reactive_only"),
    ("guarded", "guarded_scale"),
    ("lifting", "guarded"),
    ("lifting_slow", "guarded"),
    ("warn_quarter", "reactive_only"),
    ("warn_quarter_slow", "reactive_only"),
    ("skip_z6", "guarded"),
    ("hold_watch", "guarded"),
    ("warn_fall", "reactive_only"),
    ("warn_fall_half", "reactive_only"),
    ("developed_half", "guarded"),
    ("hold_waits", "reactive_only"),
    ("guarded", "no_rewind"),
)
DEVELOPS_FROM = 50  # steps from trigger to onset: the issue's "develops over 50+ steps"
SUDDEN_WITHIN = 10  # onset.SUDDEN_WITHIN
SAFE_SHARE = 0.5  # x STABLE_EDGE: the top of the sampler's healthy baseline range
FINAL_STEPS = 20
DRAWN_ADAMW = {"beta1": 0.9, "beta2": 0.95, "weight_decay": 0.1}  # nanoGPT's, Llama's
NONFINITE_PATIENCE = 10
_ROLLBACK = re.compile(r"rollback:avg\d+@(\d+)")
_AVERAGED = re.compile(r"rollback:avg(\d+)@")
_ROOT = Path(__file__).resolve().parents[1]
# the 30 configurations measured in benchmarks/README.md were picked when the seed-0
# sweep held its first 125 runs; later runs would change the round-robin's picks
FIRST_RUNS = 125


# ------------------------------------------------------------------ configurations


def _mechanism(config) -> str:
    if config.fault != "none":
        return config.fault
    return "rewarm" if config.rewarm_step else config.recipe


def _half(gap: int | None) -> str | None:
    if gap is None:
        return None
    if gap >= DEVELOPS_FROM:
        return "develops"
    return "sudden" if gap < SUDDEN_WITHIN else "between"


def _case(index, config, half: str | None, path: Path | None = None) -> dict:
    return {
        "index": index,
        "half": half,
        "mechanism": _mechanism(config),
        "recipe": config.recipe,
        "config": config.to_dict(),
        "path": path,
    }


def pick_configs(sweep: Path, per_half: int, first: int = FIRST_RUNS) -> list[dict]:
    """``per_half`` collapsed runs of each half among the first ``first`` runs of the
    seed-0 sweep, round-robin over mechanisms (the focused top-ups in the same folder
    have their own ids and are left out: their indices restart at 0)."""
    from collapse_guard.datasets.real.config import RealRunConfig
    from collapse_guard.runfiles import read_meta

    pools: dict[str, dict[str, list]] = {"develops": defaultdict(list), "sudden": defaultdict(list)}
    for path in sorted(sweep.glob("real-s0-[0-9]*.parquet"))[:first]:
        meta = read_meta(path)
        half = _half(meta.extra.get("trigger_to_onset")) if meta.onset_step is not None else None
        if half not in pools:
            continue
        config = RealRunConfig.from_dict(meta.config)
        case = _case(int(path.stem.rsplit("-", 1)[1]), config, half, path)
        pools[half][_mechanism_in(case, half)].append(case)
    picked = []
    for pool in pools.values():
        queues = [deque(v) for _, v in sorted(pool.items())]
        taken = []
        while len(taken) < per_half and any(queues):
            for queue in queues:
                if queue and len(taken) < per_half:
                    taken.append(queue.popleft())
        picked.append(sorted(taken, key=lambda c: c["index"]))
    # the halves interleaved: a partial run has results for both
    develops, sudden = picked
    return [c for pair in zip(develops, sudden, strict=False) for c in pair] + (
        develops[len(sudden) :] + sudden[len(develops) :]
    )


def sampler_cases(seed: int, indices: list[int], steps: int) -> list[dict]:
    """Sweep indices without the sweep: the half comes from the unguarded arm's run."""
    from collapse_guard.datasets.real.sampler import sample_config

    return [_case(i, sample_config(seed, i, steps), None) for i in indices]


def drawn_adamw_cases(seed: int, indices: list[int], steps: int) -> list[dict]:
    """``--drawn-adamw`` (module docstring): AdamW as large runs set it, on drawn
    architectures, LR above the edge by a warmup or a slow ramp."""
    from collapse_guard.datasets.real.sampler import Focus, sample_config

    focus = Focus(("constant_high", "slow_ramp"), ("adamw",), ("drawn",))
    cases = []
    for i in indices:
        config = replace(sample_config(seed, i, steps, focus), **DRAWN_ADAMW)
        if config.recipe == "constant_high" and i % 2:
            config = replace(config, recipe="cosine_high", min_lr_ratio=0.1)
        cases.append(_case(f"adamw-{i:03d}", config, None))
    return cases


def breadth_cases(seed: int, indices: list[int], steps: int) -> list[dict]:
    """``--breadth``: runs of the breadth sweep by index, without their files (named as
    their run ids, so that their rows are those of ``--runs`` on the files); the half comes
    from the unguarded arm's run."""
    from collapse_guard.datasets.real.sampler import Focus
    from collapse_guard.datasets.real.sweeps import sample_config

    focus = Focus(breadth=True)
    return [
        _case(f"real-s{seed}-breadth-{i:05d}", sample_config(seed, i, steps, focus), None)
        for i in indices
    ]


def run_file_cases(folder: Path, optimizer: str | None = None) -> list[dict]:
    """The collapsed runs in ``folder`` (of ``optimizer``, if given), named by the tail of
    their run id (``drawn-00012``), replayed from their stored config."""
    from collapse_guard.datasets.real.config import RealRunConfig
    from collapse_guard.runfiles import read_meta

    paths = sorted(folder.glob("*.parquet"))
    if not paths:
        raise FileNotFoundError(f"--runs {folder}: expected run files (*.parquet), found none")
    cases = []
    for path in paths:
        meta = read_meta(path)
        config = RealRunConfig.from_dict(meta.config)
        if meta.onset_step is None or optimizer not in (None, config.optimizer):
            continue
        name = meta.run_id.rsplit(".", 1)[-1]
        cases.append(_case(name, config, _half(meta.extra.get("trigger_to_onset")), path))
    return cases


def _mechanism_in(case: dict, half: str | None) -> str:
    """What a half's round-robin and tables group by: the recipe for a collapse that
    develops, the fault or re-warm for a sudden one."""
    return case["recipe"] if half == "develops" else case["mechanism"]


def safe_config(config):
    """``config`` with every LR capped at ``SAFE_SHARE`` x its edge (module docstring)."""
    from collapse_guard.datasets.real.sampler import STABLE_EDGE

    cap = SAFE_SHARE * STABLE_EDGE[config.family, config.optimizer]
    changes = {"lr": min(config.lr, cap)}
    if config.rewarm_step:
        changes["rewarm_lr"] = min(config.rewarm_lr, cap)
    if config.fault in ("lr_jump", "lr_ramp"):
        changes.update(fault="none", fault_scale=1.0)
    return replace(config, **changes)


def token_entropy(tokens, vocab: int) -> float:
    """H(next | this) of a token stream, in nats, from its bigram counts."""
    import numpy as np

    tokens = np.asarray(tokens, dtype=np.int64)
    pairs = np.bincount(tokens[:-1] * vocab + tokens[1:], minlength=vocab * vocab)
    joint = pairs.reshape(vocab, vocab) / pairs.sum()
    given = joint.sum(axis=1, keepdims=True)
    seen = joint > 0
    return float(-(joint[seen] * np.log((joint / np.where(given > 0, given, 1.0))[seen])).sum())


@functools.cache
def _stream_entropy(data: str, vocab: int) -> float:
    from collapse_guard.datasets.real.corpus import load_corpus
    from collapse_guard.datasets.real.language import load_language

    return token_entropy(load_corpus() if data == "bytes" else load_language(vocab), vocab)


def bigram_entropy(config) -> float:
    """H(next token | this token) over the run's whole token stream, in nats: the loss a
    model reaches with no context beyond one token."""
    return _stream_entropy(config.data, config.vocab_size)


# ------------------------------------------------------------------ the cheap arms


def _rule_for(config, rule: str):
    if rule == "olmo":
        return OLMoSkip()
    return ZClip(config.grad_clip or None) if rule == "zclip" else None


def first_divergence(config, rule: str, losses, norms) -> int | None:
    """First step where ``rule`` would change the unguarded run (None: never).

    Replayed on the unguarded run's own loss and pre-clip gradient norm (the sweep's
    run file): until that step the arm's trajectory is the unguarded one, so an arm
    whose rule never acts is the unguarded run, and need not be trained again.
    """
    state, clip = _rule_for(config, rule), config.grad_clip or math.inf
    for step, (loss, norm) in enumerate(zip(losses, norms, strict=True)):
        if isinstance(state, OLMoSkip) and not state.keep(loss, norm):
            return step
        if isinstance(state, ZClip):
            bound = state.bound(norm)
            if bound is not None and bound < min(norm, clip):
                return step
    return None


def train_plain(config, rule: str = "none") -> dict:
    """The runner's loop without the guard; ``rule``: ``none``, ``olmo``, ``zclip`` or
    ``qk`` (QK-clip alone)."""
    import torch

    from collapse_guard.datasets.real.data import BatchSource
    from collapse_guard.datasets.real.faults import FaultInjector
    from collapse_guard.datasets.real.runner import build

    net, optimizer = build(config)
    generator = torch.Generator().manual_seed(config.seed)
    batches, faults = BatchSource(config, generator), FaultInjector(config)
    params = [p for p in net.parameters() if p.requires_grad]
    state = _rule_for(config, rule)
    olmo = state if isinstance(state, OLMoSkip) else None
    zclip = state if isinstance(state, ZClip) else None
    kimi = KimiClip(net, optimizer) if rule == "qk" else None
    losses, acted, streak = [], 0, 0
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(step) * faults.lr_multiplier(step)
        _, loss = net(*faults.batch(step, *batches.next(), generator))
        loss.backward()
        faults.after_backward(step, net)
        if kimi:
            kimi.probe.after_backward(loss)
        norm = float(torch.nn.utils.get_total_norm([p.grad for p in params]))
        bound = zclip.bound(norm) if zclip else (config.grad_clip or None)
        if bound is not None and norm > bound:
            torch.nn.utils.clip_grads_with_norm_(params, bound, torch.tensor(norm))
        faults.before_step(step, optimizer)
        value = loss.item()
        if olmo is None or olmo.keep(value, norm):
            optimizer.step()
        else:
            acted += 1
        if kimi:
            kimi.after_step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(value)
        streak = 0 if math.isfinite(value) else streak + 1
        if streak >= NONFINITE_PATIENCE:
            break
    if kimi:
        kimi.probe.close()
        acted = kimi.clips
    return {"losses": losses, "acted": zclip.spikes if zclip else acted}


# ------------------------------------------------------------------ one task


def label_losses(losses: list[float]) -> tuple[int | None, str | None]:
    """The label's onset and kind of a run's losses, one a step (non-finite ones flagged)."""
    import pandas as pd

    from collapse_guard.runfiles.label import label_run

    frame = pd.DataFrame({"step": range(len(losses)), "loss": losses})
    # a NaN loss without this flag would read as "not measured" (label_run)
    frame["loss_nonfinite"] = (~frame["loss"].map(math.isfinite)).astype(float)
    label = label_run(frame)
    return label.onset_step, label.kind


def _final(losses: list[float]) -> float:
    """Mean of the last finite losses; inf for a run that ended non-finite (diverged)."""
    if losses and not math.isfinite(losses[-1]):
        return math.inf
    tail = [x for x in losses[-FINAL_STEPS:] if math.isfinite(x)]
    return sum(tail) / len(tail) if tail else math.nan


def _best(losses: list[float]) -> float:
    """The lowest mean of ``FINAL_STEPS`` consecutive finite losses (inf: none)."""
    finite = [x for x in losses if math.isfinite(x)]
    if len(finite) < FINAL_STEPS:
        return math.inf
    window = sum(finite[:FINAL_STEPS])
    best = window
    for old, new in zip(finite, finite[FINAL_STEPS:], strict=False):
        window += new - old
        best = min(best, window)
    return best / FINAL_STEPS


def _steps_lost(events: list[tuple[int, str]]) -> int:
    """Steps undone by rollbacks: each rescue step minus the step its checkpoint holds."""
    return sum(step - int(m.group(1)) for step, e in events if (m := _ROLLBACK.match(e)))


def _run_guarded(config, policy: dict) -> dict:
    from collapse_guard.demo import run_scenario
    from collapse_guard.predictor import RiskModel
    from collapse_guard.runfiles import read_run

    with tempfile.TemporaryDirectory(prefix="guard-rescue-") as out:
        run = run_scenario(config, RiskModel.load(), guarded=True, out=Path(out), policy=policy)
        frame, _ = read_run(next(Path(out).glob("*.parquet")))
    kinds = Counter(e.split(":")[0] for _, e in run.events)
    logit_max = frame["attn_logit_max"].max()  # NaN: never probed
    return {
        "logit_max": float(logit_max) if math.isfinite(logit_max) else None,
        "averaged": max(
            (int(m.group(1)) for _, e in run.events if (m := _AVERAGED.match(e))), default=0
        ),
        "losses": run.losses,
        "rescues": kinds["rescue"],
        "skips": kinds["skip"],
        "qk_clips": kinds["qk_clip"],
        "holds": sum(e.startswith("lr_hold:") and e != "lr_hold:off" for _, e in run.events),
        "steps_lost": _steps_lost(run.events),
        "gave_up": run.gave_up,
        "first_warning": run.first_warning,
        "risk_max": max(run.risk.values(), default=None),  # held P(collapse): how near warn
    }


def _from_run_file(path: str) -> dict:
    from collapse_guard.runfiles import read_run

    frame, _ = read_run(path)
    return {"losses": frame["loss"].tolist(), "norms": frame["grad_norm"].tolist()}


def _train(task: dict, config) -> dict:
    arm = task["arm"]
    stored = _from_run_file(task["path"]) if task.get("path") else None
    if arm == "unguarded" and stored:
        return {"losses": stored["losses"], "source": "run file"}
    if arm in ("olmo", "zclip") and stored:
        if first_divergence(config, arm, stored["losses"], stored["norms"]) is None:
            return {"losses": stored["losses"], "acted": 0, "source": "run file (never acts)"}
    if arm in GUARD_POLICIES:
        return _run_guarded(config, GUARD_POLICIES[arm])
    if arm == "safe_lr":
        return train_plain(safe_config(config))
    return train_plain(config, {"qk_alone": "qk"}.get(arm, arm if arm != "unguarded" else "none"))


def result_row(task: dict, config, result: dict, seconds: float) -> dict:
    """The JSON line of one (configuration, arm) from its trained ``result``."""
    from collapse_guard.datasets.real.onset import onset_kind

    losses = result.pop("losses")
    onset, kind = label_losses(losses)
    _, gap = onset_kind(config.triggers(), onset)
    bigram, best = bigram_entropy(config), _best(losses)
    healthy = onset is None and not result.get("gave_up", False)
    return {
        **{k: task[k] for k in ("index", "half", "mechanism", "recipe", "arm", "key")},
        "onset": onset,
        "kind": kind,
        "gap": gap,
        "healthy": healthy,
        "saved": healthy and best < bigram,
        "final_loss": _final(losses),
        "best_loss": best,
        "bigram": round(bigram, 4),
        "steps_run": len(losses),
        "seconds": round(seconds, 1),
        **result,
        "losses": [round(x, 4) if math.isfinite(x) else x for x in losses],
    }


def run_task(task: dict) -> dict:
    """Train one (configuration, arm); the JSON line of its result."""
    import torch

    from collapse_guard.datasets.real.config import RealRunConfig

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # preflight: small models train above the seed's LRs
    config = RealRunConfig.from_dict(task["config"])
    began = time.perf_counter()
    result = _train(task, config)
    return result_row(task, config, result, time.perf_counter() - began)


# ------------------------------------------------------------------ driver


def _code(path: Path) -> bytes:
    """What a module does, without what it says: its syntax tree with the docstrings
    dropped (comments are not in it), so a reworded docstring reruns nothing."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def guard_key() -> str:
    """Hash of the guard's code (``_code``) and the bundled model: a change to either
    reruns only the guard's arms."""
    digest = hashlib.sha256()
    files = sorted((_ROOT / "collapse_guard" / "guard").glob("*.py"))
    for path in [*files, _ROOT / "collapse_guard" / "demo.py"]:
        digest.update(_code(path))
    for path in sorted((_ROOT / "collapse_guard" / "predictor" / "default_model").glob("*")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _done(results: Path) -> dict[tuple, dict]:
    rows = {}
    if results.exists():
        for line in results.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["index"], row["arm"], row["key"]] = row
    return rows


def same_as_guarded(arm: str, guarded: dict) -> str | None:
    """Why ``arm`` would train the very run the ``guarded`` arm trained, or None.

    Each of these arms differs from ``guarded`` only from an event on: a head over tau at
    a probe pass (the QK-clip modes plan from the same passes, and nothing else in them
    differs), a first rescue as well (``rescue_*``: no clip before one), a rollback that
    averaged more than one checkpoint (``newest``). A guarded run without that event is
    the arm's run, bit for bit, and need not be trained again; so is every run of an arm
    whose policy is the guard's defaults.
    """
    from collapse_guard.guard import GuardPolicy

    defaults, policy = GuardPolicy(), GUARD_POLICIES.get(arm)
    if policy is not None and all(getattr(defaults, k) == v for k, v in policy.items()):
        return "the policy's defaults"  # rescue_developed, since developed_rescue_lr is 0.25
    top = guarded.get("logit_max")
    under_tau = (
        f"no head over tau (max logit {top:.1f})" if top is not None and top <= QK_TAU else None
    )
    if arm in ("guarded_no_qk", "guarded_qk_watch"):
        return under_tau
    if arm in CAP_ARMS:
        return "no rescue" if guarded.get("rescues") == 0 else None
    if arm in ("rescue_qk", "rescue_both"):
        return f"no rescue, {under_tau}" if under_tau and guarded.get("rescues") == 0 else None
    if arm in FORECAST_ARMS and "first_warning" in guarded:
        return "never at warn" if guarded["first_warning"] is None else None  # the level's
        # actions below warn are the same in each: a watch checkpoints in every one
    if arm == "newest" and "averaged" in guarded:
        return "no rollback averaged" if guarded["averaged"] <= 1 else None
    return None


def _copies(args, configs: list[dict], done: dict) -> list[dict]:
    """The rows of arms whose run is the guarded one (``same_as_guarded``)."""
    current, rows = guard_key(), []
    for arm in args.arms:
        for c in configs:
            guarded = done.get((c["index"], "guarded", current))
            if arm == "guarded" or (c["index"], arm, current) in done or guarded is None:
                continue
            why = same_as_guarded(arm, guarded)
            if why is not None:
                rows.append({**guarded, "arm": arm, "seconds": 0.0, "source": f"guarded: {why}"})
    return rows


def _tasks(args, configs: list[dict], done: dict) -> list[dict]:
    current = guard_key()
    tasks = []
    pairs = [(arm, c) for arm in args.arms for c in configs]  # arm by arm, in --arms order
    if args.by_config:  # configuration by configuration: complete rows first
        pairs = [(arm, c) for c in configs for arm in args.arms]
    for arm, c in pairs:
        key = current if arm in GUARD_POLICIES else "-"
        if (c["index"], arm, key) in done:
            continue
        stored = c["path"] is not None and arm in ("unguarded", "olmo", "zclip")
        reread = stored and not (args.rerun_unguarded and arm == "unguarded")
        tasks.append(
            {
                **{k: c[k] for k in ("index", "half", "mechanism", "recipe", "config")},
                "arm": arm,
                "key": key,
                "path": str(c["path"]) if reread else None,
            }
        )
    return tasks


def _by_config(done: dict, current: str) -> dict:
    """index -> arm -> row (the guard's arms: those of guard source ``current``), each
    row's half and mechanism those of its configuration: the unguarded run's own where
    the configuration came without one (``--only`` without a sweep)."""
    by: dict = defaultdict(dict)
    for (index, arm, key), row in done.items():
        if arm in ARMS and (arm not in GUARD_POLICIES or key == current):
            by[index][arm] = row
    for arms in by.values():
        first = arms.get("unguarded") or next(iter(arms.values()))
        half = first["half"] or _half(arms["unguarded"]["gap"] if "unguarded" in arms else None)
        for row in arms.values():
            row["half"], row["group"] = half, _mechanism_in(row, half)
    return by


def report(results: Path, current: str) -> None:
    """The per-configuration and per-arm tables (markdown) from the results file; the
    guard's arms are those of guard source ``current``."""
    by = _by_config(_done(results), current)
    print(f"guard source key {current}; results in {results}\n")
    tables.config_table(by, ARMS, tuple(GUARD_POLICIES))
    print()
    tables.arm_table(by, ARMS, HALVES)
    print()
    tables.paired_lines(by, PAIRS)
    print()
    tables.average_table(by)
    print()
    tables.healthy_table(by, tuple(GUARD_POLICIES))
    walls = defaultdict(list)
    for arms in by.values():
        for arm, row in arms.items():
            if row.get("source") is None:  # trained here, not read from a run file
                walls[arm].append(row["seconds"])
    print(
        "\nmedian wall per run: "
        + ", ".join(
            f"{arm} {statistics.median(v):.0f} s ({len(v)} runs)"
            for arm, v in sorted(walls.items())
        )
    )


def _cases(args) -> list[dict]:
    """The configurations the arguments name (module docstring)."""
    cases = []
    if args.only and not args.sweep.exists():
        cases += sampler_cases(args.seed, args.only, args.steps)
    elif args.sweep.exists() and (args.only or not (args.runs or args.drawn_adamw or args.breadth)):
        picked = pick_configs(args.sweep, args.per_half, args.first)
        cases += [c for c in picked if not args.only or c["index"] in args.only]
    if args.drawn_adamw:
        cases += drawn_adamw_cases(args.seed, args.drawn_adamw, args.steps)
    if args.breadth:
        cases += breadth_cases(args.seed, args.breadth, args.steps)
    for folder in args.runs:
        cases += run_file_cases(folder, args.runs_optimizer)
    if not cases:
        raise FileNotFoundError(
            f"no configurations: {args.sweep} is not a sweep folder and none of --only, "
            "--drawn-adamw, --breadth, --runs was given; pass --only INDEX ... (drawn by the "
            "sampler), --drawn-adamw INDEX ..., --breadth INDEX ... or --runs DIR"
        )
    return cases


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", type=Path, default=Path("/root/cg-data/real"))
    parser.add_argument("--out", type=Path, default=Path("guard-rescue"))
    parser.add_argument("--per-half", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0, help="the sweep's sampler seed")
    parser.add_argument("--steps", type=int, default=1000, help="the sweep's steps per run")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS[:8]))
    parser.add_argument(
        "--only", type=int, nargs="*", help="these sweep indices only (no sweep: sampled)"
    )
    parser.add_argument(
        "--drawn-adamw", type=int, nargs="*", help="issue 24's AdamW set-ups of these indices"
    )
    parser.add_argument(
        "--breadth", type=int, nargs="*", help="the breadth sweep's runs of these indices"
    )
    parser.add_argument("--runs", type=Path, action="append", default=[], help="run files")
    parser.add_argument("--runs-optimizer", help="of --runs, only this optimizer's")
    parser.add_argument(
        "--first",
        type=int,
        default=FIRST_RUNS,
        help=f"pick among the seed-0 sweep's first N runs (default {FIRST_RUNS})",
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rerun-unguarded", action="store_true")
    parser.add_argument(
        "--by-config", action="store_true", help="all arms of a configuration before the next"
    )
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--guard-key", help="report the guard's runs of this guard source hash")
    return parser


def _run(args, results: Path) -> None:
    try:
        configs = _cases(args)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    done = _done(results)
    copies = _copies(args, configs, done)
    with results.open("a") as handle:
        for row in copies:
            handle.write(json.dumps(row) + "\n")
            done[row["index"], row["arm"], row["key"]] = row
    tasks = _tasks(args, configs, done)
    print(f"{len(copies)} runs are the guarded arm's (same_as_guarded)", flush=True)
    print(f"{len(configs)} configurations, {len(tasks)} runs to do", flush=True)
    began = time.perf_counter()
    with get_context("spawn").Pool(args.workers) as pool:
        for row in pool.imap_unordered(run_task, tasks):
            with results.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
            print(
                f"{row['index']!s:>10} {row['arm']:16s} {tables.outcome(row):16s} "
                f"final {tables.fmt(row['final_loss'])} {row['seconds']:.0f} s",
                flush=True,
            )
    print(f"wall {time.perf_counter() - began:.0f} s", flush=True)


def main() -> None:
    args = _parser().parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    if not args.report_only:
        _run(args, results)
    report(results, args.guard_key or guard_key())


if __name__ == "__main__":
    main()
