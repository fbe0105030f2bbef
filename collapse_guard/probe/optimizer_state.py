"""Optimizer-state group: what the optimizer holds and does, at the update sketch's coordinates.

Read at the coordinates of :class:`~collapse_guard.probe.updates.UpdateGroup`'s sketch
(the same ``sketch_seed``, so the same coordinates), from the parameters, their
gradients and the optimizer's state. ``g`` is the gradient the step used (read after
it: clipped, unscaled), ``u`` the realised update (the parameters after the step minus
before), ``lr`` the tensor's group's LR; for Adam ``m_hat = m / (1 - beta1^t)`` and
``v_hat = v / (1 - beta2^t)``, ``eps`` the group's.

=========================  =========================================================
key                        meaning
=========================  =========================================================
``opt_v_lag_frac``         Adam: share of coordinates where g^2 < v_hat / 10: the
                           second moment lags a gradient that fell (arXiv 2506.04805:
                           a spike follows); 0 at the first step (v_hat = g^2)
``opt_v_lag_log``          Adam: mean of log((g^2 + eps^2) / (v_hat + eps^2)) (nats);
                           0 at the first step, below 0 while v lags. Its trend over
                           1 / (1 - beta2) steps is the window features' job
``opt_m_rms``              Adam: RMS of m_hat (the gradient's scale)
``opt_v_rms``              Adam: RMS of 1 / (sqrt(v_hat) + eps) over coordinates with
                           v_hat > 0 (a coordinate never seen would read 1 / eps)
``opt_update_rms``         any optimizer: RMS of u / lr (Adam ~0.2-1; Lion 1 without
                           weight decay, less only where its momentum is 0; SGD the
                           momentum's scale)
``opt_update_spread``      any optimizer: std of ln(||u_i|| / ||param_i||) over the
                           weight matrices (>= 2 dims) that moved: how unevenly the
                           step moves the layers; NaN with fewer than two
``opt_momentum_cos``       cosine of the momentum (Adam's and Lion's m, SGD's and Muon's
                           buffer; the gradient itself for SGD without momentum: 1)
                           with the gradient
``opt_sign_agree``         Lion: share of coordinates with g != 0 where the update
                           opposes the gradient (sign(u) = -sign(g)); 1 at the first step
``opt_ortho_rms``          Muon: RMS of u / lr on Muon's matrices: the orthogonalised
                           update's RMS (0.2 for a full-rank update with torch's
                           ``adjust_lr_fn="match_rms_adamw"``; lower as its rank falls)
``stability_margin``       curvature along the realised update times the LR over the
                           optimizer's threshold: 1 is the edge of stability (below)
=========================  =========================================================

The stability margin. Between the gradients ``g_{t-1}`` and ``g_t`` (read at
``after_backward``: before clipping, unscaled) the parameters moved by ``u = u_{t-1}``,
so ``g_t - g_{t-1} ~ H u`` and ``(g_t - g_{t-1}) . u`` is the curvature along ``u``
times ``|u|^2``. On a quadratic gradient descent is stable while ``lr x curvature < 2``;
with torch SGD's momentum mu (dampening d) while ``lr (1 - d) x curvature < 2 (1 + mu)``,
``2 (1 + mu) / (1 + 2 mu)`` with Nesterov; Adam (an EMA momentum, preconditioned by
``P = sqrt(v_hat) + eps``) while ``lr x`` the preconditioned curvature ``< (2 + 2 beta1)
/ (1 - beta1)``, 38 at beta1 = 0.9 (Cohen et al. 2022). With ``theta_i`` that threshold
divided by the tensor's LR (times ``P`` for Adam), the margin is::

    stability_margin = (g_t - g_{t-1}) . u  /  sum_i theta_i u_i^2

the Rayleigh quotient of the preconditioned Hessian along ``u``, over its threshold (SGD
without momentum: ``lr x curvature / 2``). It is measured at each due step, from the
step before (the group's ``lead``): two consecutive batches, so it carries the batches'
difference too, ``(xi . u) / sum theta u^2`` with ``xi`` the gradient noise between
batches: that term grows as ``1 / |u|``, so at small LRs the margin is mostly noise,
of either sign; near the edge ``H u`` dominates. NaN for Lion and Muon (a sign or an
orthogonalised step has no such threshold) and for any model with a tensor stepped by
one of them or by an unknown optimizer.

Optimizers known: ``torch.optim.Adam`` / ``AdamW``, ``SGD``, ``Muon``, any class named
``Lion`` holding ``exp_avg`` (``collapse_guard.datasets.real.optim.Lion``, lion-pytorch),
and optimizers holding such optimizers as attributes (``MuonAdamW``). Tensors stepped by
any other optimizer give NaN for the state's readings, with one warning per probe; the
readings of the realised update (``opt_update_rms``, ``opt_update_spread``) need no state.

Cost: the due step and the one before it gather the sketch of the gradients (at both
events) and of the state's moments (a few ``index_select`` of ``sketch_size`` coordinates
a tensor); the parameters' sketch is the update group's, gathered once for both.
``optimizer_every`` (``ProbeConfig``) keeps it small.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from collapse_guard.probe.gradients import unscale_factor
from collapse_guard.probe.state import Event, ProbeState
from collapse_guard.probe.updates import SketchedGroup

__all__ = ["OptimizerStateGroup", "optimizer_parts", "stability_threshold"]

ADAM, SGD, LION, MUON = "adam", "sgd", "lion", "muon"
_MOMENTUM_KEY = {ADAM: "exp_avg", LION: "exp_avg", SGD: "momentum_buffer", MUON: "momentum_buffer"}
# the readings of the realised update alone: measured whatever the optimizer
_STATELESS = ("opt_update_rms", "opt_update_spread")
_LAG = 0.1  # g^2 below this share of v_hat: the second moment lags (arXiv 2506.04805)


def _kind(optimizer: torch.optim.Optimizer) -> str | None:
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return ADAM
    if isinstance(optimizer, torch.optim.SGD):
        return SGD
    muon = getattr(torch.optim, "Muon", None)  # torch >= 2.9
    if muon is not None and isinstance(optimizer, muon):
        return MUON
    if type(optimizer).__name__ == "Lion" and "betas" in optimizer.defaults:
        return LION
    return None


def optimizer_parts(optimizer: object) -> list[tuple[str | None, object]]:
    """``[(kind, optimizer)]`` for each optimizer that steps parameters: the optimizer
    itself when known, else the known optimizers it holds as attributes or in a list or
    tuple attribute (a ``ChainedOptimizer``'s ``optimizers``: ``MuonAdamW``'s Muon and
    AdamW), else ``[(None, optimizer)]``."""
    kind = _kind(optimizer) if isinstance(optimizer, torch.optim.Optimizer) else None
    if kind is not None:
        return [(kind, optimizer)]
    held = [
        item
        for value in getattr(optimizer, "__dict__", {}).values()
        for item in (value if isinstance(value, list | tuple) else (value,))
    ]
    inner = [
        part
        for value in held
        if isinstance(value, torch.optim.Optimizer) and value is not optimizer
        for part in optimizer_parts(value)
    ]
    return inner if inner and all(k is not None for k, _ in inner) else [(None, optimizer)]


def stability_threshold(kind: str | None, group: dict) -> float:
    """The largest ``lr x curvature`` (preconditioned for Adam) at which ``kind``'s step
    is stable on a quadratic, for param group ``group``; NaN where there is none known."""
    if kind == ADAM:
        beta1 = group["betas"][0]
        return (2 + 2 * beta1) / (1 - beta1)
    if kind == SGD:
        mu = group.get("momentum", 0.0)
        damping = 1 - group.get("dampening", 0.0) if mu else 1.0  # dampening needs momentum
        nesterov = 1 + 2 * mu if group.get("nesterov", False) else 1.0
        return 2 * (1 + mu) / (nesterov * damping)
    return math.nan


@dataclass(frozen=True)
class _Tensor:
    """How one parameter tensor is stepped: its optimizer's kind, state and group."""

    kind: str | None
    state: object  # the (sub-)optimizer's state mapping, or None
    group: dict | None


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask``; NaN (0 / 0) where it holds nowhere."""
    return torch.where(mask, values, 0.0).sum() / mask.sum()


def _cos(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    a, b = torch.where(mask, a, 0.0), torch.where(mask, b, 0.0)
    return (a * b).sum() / (a.norm() * b.norm())


class OptimizerStateGroup(SketchedGroup):
    keys = (
        "opt_v_lag_frac",
        "opt_v_lag_log",
        "opt_m_rms",
        "opt_v_rms",
        "opt_update_rms",
        "opt_update_spread",
        "opt_momentum_cos",
        "opt_sign_agree",
        "opt_ortho_rms",
        "stability_margin",
    )
    period_field = "optimizer_every"
    events = frozenset({Event.AFTER_BACKWARD, Event.AFTER_STEP})
    lead = 1  # the margin compares the due step's gradient with the step before's

    def __init__(self, config=None) -> None:
        self._warned = False  # once per probe: reset() does not give the warning again
        super().__init__(config)

    def reset(self) -> None:
        super().reset()
        self._tensors: list[_Tensor] = []
        self._groups: list[dict] = []  # the Adam param groups, in tensor order
        self._group_of: torch.Tensor | None = None  # tensor -> its Adam group (or one past)
        self._layout_key: tuple = ()
        self._before: tuple[int, torch.Tensor] | None = None  # (step, params' sketch)
        self._after: tuple[int, torch.Tensor] | None = None  # the same, after the step
        self._raw: tuple[int, torch.Tensor] | None = None  # (step, gradient before clipping)
        self._pair: tuple[int, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        # (step, its raw gradient, its update u, theta per coordinate): the margin's start

    # ------------------------------------------------------------------ layout
    def _layout(self, optimizer: object, params: list[torch.nn.Parameter]) -> None:
        """Which optimizer steps each tensor (again when the groups changed)."""
        parts = optimizer_parts(optimizer)
        key = (self._param_ids, tuple((id(o), len(o.param_groups)) for _, o in parts))
        if key == self._layout_key:
            return
        self._layout_key = key
        stepped = {}
        for kind, part in parts:
            state = getattr(part, "state", None)
            for group in getattr(part, "param_groups", []):
                for p in group["params"]:
                    stepped[id(p)] = _Tensor(kind, state, group)
        self._tensors = [stepped.get(id(p), _Tensor(None, None, None)) for p in params]
        groups = {id(t.group): t.group for t in self._tensors if t.kind == ADAM}
        self._groups = list(groups.values())
        number = {key: n for n, key in enumerate(groups)}
        self._group_of = torch.tensor(
            [number.get(id(t.group), len(groups)) for t in self._tensors],
            device=self._segment.device,
        )
        unknown = [t for t in self._tensors if t.kind is None and t.group is not None]
        if unknown and not self._warned:
            self._warned = True
            names = ", ".join(k for k in self.keys if k not in _STATELESS)
            warnings.warn(
                f"collapse-guard probe: {names} are NaN for {len(unknown)} of "
                f"{len(params)} tensors: the probe reads the state of torch's Adam, AdamW, "
                f"SGD and Muon and of Lion, not of {type(optimizer).__name__}. This warning "
                "is given once.",
                RuntimeWarning,
                stacklevel=4,
            )

    def _coords(self, values: list[float], device: torch.device) -> torch.Tensor:
        """Per-tensor values spread over the sketch's coordinates."""
        per_tensor = torch.tensor(values, dtype=torch.float32, device=device)
        return per_tensor.index_select(0, self._segment)

    def _state_sketch(self, params: list, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The sketch of state ``key`` and where it exists (the parameter stands in for a
        missing one: same shape, masked out)."""
        found = [
            t.state.get(p, {}).get(key) if t.state is not None else None
            for t, p in zip(self._tensors, params, strict=True)
        ]
        tensors = [p if f is None else f for f, p in zip(found, params, strict=True)]
        mask = self._coords([f is not None for f in found], params[0].device) > 0
        return self._sketch(tensors), mask

    def _grads(self, params: list, scale: torch.Tensor | None = None) -> torch.Tensor:
        sketch = self._sketch([p if p.grad is None else p.grad for p in params])
        has = self._coords([p.grad is not None for p in params], params[0].device) > 0
        sketch = torch.where(has, sketch, 0.0)
        return sketch if scale is None else sketch * scale.to(sketch.device)

    def _lrs(self, device: torch.device) -> torch.Tensor:
        return self._coords(
            [float(t.group["lr"]) if t.group else math.nan for t in self._tensors], device
        )

    def _kind_mask(self, kinds: tuple[str, ...], device: torch.device) -> torch.Tensor:
        return self._coords([t.kind in kinds for t in self._tensors], device) > 0

    def _bias(self, params: list, beta: int, device: torch.device) -> torch.Tensor:
        """1 - beta^t per coordinate (1 off Adam's tensors): t from each Adam param
        group's first stepped tensor (a group steps together)."""
        steps = {}
        for t, p in zip(self._tensors, params, strict=True):
            if t.kind == ADAM and id(t.group) not in steps and p in t.state:
                steps[id(t.group)] = t.state[p]["step"]
        factors = [
            1 - group["betas"][beta] ** torch.as_tensor(steps[id(group)], dtype=torch.float32)
            if id(group) in steps
            else torch.ones(())
            for group in self._groups
        ]
        factors = torch.stack([f.to(device) for f in factors] + [torch.ones((), device=device)])
        return factors.index_select(0, self._group_of).index_select(0, self._segment)

    def _adam_v(self, params: list, device: torch.device):
        """(v_hat, eps, where Adam's second moment exists) at the sketch's coordinates."""
        v, has = self._state_sketch(params, "exp_avg_sq")
        eps = [t.group["eps"] if t.kind == ADAM else 1.0 for t in self._tensors]
        adam = self._kind_mask((ADAM,), device) & has
        return v / self._bias(params, 1, device), self._coords(eps, device), adam

    # ------------------------------------------------------------------ margin
    def _theta(self, params: list, device: torch.device) -> torch.Tensor:
        """Each coordinate's threshold over its LR (times P for Adam): the weights of the
        margin's denominator; NaN where no threshold is known."""
        per_tensor = []
        for t in self._tensors:
            threshold = stability_threshold(t.kind, t.group) if t.group else math.nan
            lr = float(t.group["lr"]) if t.group else math.nan
            per_tensor.append(threshold / lr if lr > 0 else math.nan)
        theta = self._coords(per_tensor, device)
        if self._groups:
            v_hat, eps, adam = self._adam_v(params, device)
            theta = torch.where(adam, theta * (v_hat.sqrt() + eps), theta)
        return theta

    def _margin(self, step: int, raw: torch.Tensor) -> torch.Tensor | float:
        if self._pair is None or self._pair[0] != step - 1:
            return math.nan
        _, before, update, theta = self._pair
        # a moved tensor without a threshold (Lion, Muon, unknown) has theta NaN: so has
        # the margin; one that did not move (frozen, outside the optimizer) does not count
        weight = torch.where(update != 0, theta * update.square(), 0.0)
        return ((raw - before) * update).sum() / weight.sum()

    # ------------------------------------------------------------------ readings
    def _readings(self, params, update, sketch, device) -> dict[str, torch.Tensor]:
        grad = self._grads(params)  # after the step: what the optimizer used
        lr = self._lrs(device)
        per_lr = update / lr
        moved = lr > 0
        values = {"opt_update_rms": _masked_mean(per_lr.square(), moved).sqrt()}
        values["opt_update_spread"] = self._spread(update, sketch)
        momentum, has_momentum = self._momentum(params, device)  # Adam's m among them
        values["opt_momentum_cos"] = _cos(momentum, grad, has_momentum)
        if self._groups:
            m_hat = momentum / self._bias(params, 0, device)
            v_hat, eps, adam = self._adam_v(params, device)
            adam = adam & has_momentum
            g2 = grad.square()
            values["opt_v_lag_frac"] = _masked_mean((g2 < _LAG * v_hat).float(), adam)
            lag = ((g2 + eps.square()) / (v_hat + eps.square())).log()
            values["opt_v_lag_log"] = _masked_mean(lag, adam)
            values["opt_m_rms"] = _masked_mean(m_hat.square(), adam).sqrt()
            inverse = (v_hat.sqrt() + eps).reciprocal().square()
            values["opt_v_rms"] = _masked_mean(inverse, adam & (v_hat > 0)).sqrt()
        lion = self._kind_mask((LION,), device) & (grad != 0)
        values["opt_sign_agree"] = _masked_mean((update * grad < 0).float(), lion)
        muon = self._kind_mask((MUON,), device) & moved
        values["opt_ortho_rms"] = _masked_mean(per_lr.square(), muon).sqrt()
        # a skipped update (the guard's skip, AMP's) moved nothing: there is no step to
        # read, and what the gradient looks like depends on where the skip came (clipped or
        # not); on the device, so that a deferred step reads nothing to the host
        stepped = (update != 0).any()
        return {key: torch.where(stepped, value, math.nan) for key, value in values.items()}

    def _spread(self, update: torch.Tensor, sketch: torch.Tensor) -> torch.Tensor:
        """Sample std of ln(||u_i|| / ||param_i||) over the weight matrices that moved,
        masked rather than selected (a boolean select reads its size from the device)."""
        ratio = (self._per_tensor(update.square()) / self._per_tensor(sketch.square())).sqrt()
        ratio = ratio.index_select(0, self._weights)
        live = (ratio > 0) & ratio.isfinite()
        log = torch.where(live, ratio, 1.0).log()
        mean = _masked_mean(log, live)
        n = live.sum()
        return (torch.where(live, log - mean, 0.0).square().sum() / (n - 1).clamp_min(0)).sqrt()

    def _momentum(self, params, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The momentum's sketch (Adam's and Lion's m, SGD's and Muon's buffer; the
        gradient for SGD without momentum, which steps along it) and where it exists."""
        tensors, has = [], []
        for t, p in zip(self._tensors, params, strict=True):
            key = _MOMENTUM_KEY.get(t.kind)
            found = t.state.get(p, {}).get(key) if key else None
            plain = t.kind == SGD and not t.group.get("momentum", 0.0) and p.grad is not None
            tensors.append(p.grad if plain else p if found is None else found)
            has.append(plain or found is not None)
        return self._sketch(tensors), self._coords(has, device) > 0

    # ------------------------------------------------------------------ update
    @torch.no_grad()
    def update(self, state: ProbeState) -> OptimizerStateGroup:
        params = state.trainable()
        if not params:
            return self
        self._setup(params)
        self._layout(state.optimizer, params)
        period, step = self.config.optimizer_every, state.step
        device = self._segment.device
        if state.event is Event.AFTER_BACKWARD:
            raw = self._grads(params, unscale_factor(state.scaler, state.optimizer))
            self._raw = (step, raw)
            if step % period == 0:
                self._values["stability_margin"] = self._margin(step, raw)
            if self._after is not None and self._after[0] == step - 1:
                self._before = (step, self._after[1])  # nothing moves between steps
            else:
                self._before = (step, self._param_sketch(state, params))
            return self
        sketch = self._param_sketch(state, params)
        before = self._before[1] if self._before and self._before[0] == step else None
        if before is None and self._after is not None and self._after[0] == step - 1:
            before = self._after[1]  # after_backward was not called this step
        self._after, self._before = (step, sketch), None
        if before is None:
            return self
        update = sketch - before
        if (step + 1) % period == 0 and self._raw is not None and self._raw[0] == step:
            self._pair = (step, self._raw[1], update, self._theta(params, device))
        if step % period == 0:
            self._values.update(self._readings(params, update, sketch, device))
        return self
