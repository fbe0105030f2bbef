"""Per-head QK-clip: scale a head's W_q and W_k down after the update when its largest
pre-softmax logit passed tau (Kimi K2's MuonClip, arXiv 2507.20534; Megatron-Core's
``optimizer/qk_clip.py``).

For head h with S_h = its largest logit over the probe batch, S_h > tau: the rows of W_q
(and of the q bias) that make head h are multiplied by sqrt(tau / S_h), and those of
W_k by the same, so q . k, and the logit, shrinks by tau / S_h. A weight edit after
the update: the model's forward and backward stay the user's own. S_h is floored at
tau before the square root (Megatron-LM PR #7382: a head whose logits were all <= 0
gave the square root of a negative number, NaN weights): every head at or under tau,
negative, -inf (all keys masked) or NaN, gets a factor of exactly 1, and tau > 0 keeps
the floor positive.

Grouped-query heads (one k head shared by G q heads): the k head is scaled by
sqrt(tau / S_max) of its most-exceeding q head, and each q head over tau by its own
sqrt(tau / S_h). Every logit of the group then ends at or under tau (head h at
tau * sqrt(S_h / S_max)), the most-exceeding one exactly at tau, and no weight is ever
scaled up. Megatron scales every q head of the group by the group's factor, which
shrinks the heads that did not exceed tau more than needed; making each exceeding head
land exactly on tau instead would scale some q heads *up* (when S_max >> S_h).

Where a head's parameters are, per layout (:func:`find_layout`): separate ``q_proj`` /
``k_proj`` (transformers' Llama, Qwen2, Mistral), a fused ``qkv`` / ``c_attn`` whose
outputs are [q; k; v] (nanoGPT, this project's ``SelfAttention``, transformers' GPT-2
with its transposed ``Conv1D``), GPT-NeoX's ``query_key_value`` ([q_h; k_h; v_h] per
head),
``nn.MultiheadAttention``'s ``in_proj_weight`` (or its separate ``q_proj_weight`` /
``k_proj_weight``), or the user's mapping (:class:`QKLayout` per module name, as a
dict or a callable). The q head count comes from the captured call; a fused [q; k; v]
whose module says it has fewer key/value heads (``n_kv_head``, ``num_key_value_heads``
and their spellings, on it or its ``config``) is split as [q; k; v] of that many (the call
alone cannot tell a grouped fused layer from equal thirds); anything else, and a module
with qk-norm (the norm undoes any scale of W_q), is not clipped and named once in a
warning.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from collapse_guard.guard.device_gate import HostCopy
from collapse_guard.predictor.core.levels import WATCH, Level
from collapse_guard.probe.capture import AttentionCapture

__all__ = [
    "QKClip",
    "QKLayout",
    "QKMapping",
    "QKPlan",
    "find_layout",
    "head_factors",
    "head_maxima",
]

_FUSED = ("qkv", "c_attn", "query_key_value")
# a module's count of key/value heads, as the libraries spell it (lit-gpt: n_query_groups)
_KV_HEAD_KEYS = ("n_kv_head", "n_kv_heads", "num_key_value_heads", "num_kv_heads", "n_query_groups")
_QK_NORMS = ("q_norm", "k_norm", "q_layernorm", "k_layernorm")

# module name -> (per-q-head factor, per-k-head factor): plain floats, so a plan goes
# through broadcast_object_list and into a weights_only checkpoint as it is
QKPlan = dict[str, tuple[list[float], list[float]]]


@dataclass(frozen=True, eq=False)  # tensors inside: identity, not ==
class QKLayout:
    """Where one attention module's heads are: q head h is the ``head_dim`` rows from
    ``q_start + h * head_stride`` of ``q_weight`` (and of ``q_bias``, if any); k head g
    likewise in ``k_weight``. ``head_stride`` 0 means ``head_dim`` (heads side by side;
    GPT-NeoX's ``query_key_value`` interleaves [q; k; v] per head: 3 x head_dim).
    ``axis`` is the weight's output dimension: 0 for ``nn.Linear``, 1 for transformers'
    ``Conv1D`` (GPT-2). q head h reads k head ``h // (n_heads // n_kv_heads)``
    (transformers' ``repeat_kv``, SDPA's ``enable_gqa``)."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    n_heads: int
    n_kv_heads: int
    head_dim: int
    q_start: int = 0
    k_start: int = 0
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    head_stride: int = 0
    axis: int = 0

    @property
    def stride(self) -> int:
        return self.head_stride or self.head_dim

    def __post_init__(self) -> None:
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"QKLayout: n_heads={self.n_heads} must be a multiple of "
                f"n_kv_heads={self.n_kv_heads} (each k head serves the same number of q heads)"
            )
        for name, weight, start, heads in (
            ("q", self.q_weight, self.q_start, self.n_heads),
            ("k", self.k_weight, self.k_start, self.n_kv_heads),
        ):
            end = start + (heads - 1) * self.stride + self.head_dim
            if end > weight.size(self.axis):
                raise ValueError(
                    f"QKLayout: {name} heads need rows {start}..{end} of a {name}_weight "
                    f"with {weight.size(self.axis)} along axis {self.axis}; check head_dim "
                    f"({self.head_dim}), head_stride and {name}_start ({start})"
                )


QKMapping = Mapping[str, QKLayout] | Callable[[str, nn.Module], QKLayout | None] | None


def head_maxima(captures: Sequence[AttentionCapture]) -> dict[str, torch.Tensor]:
    """Per calling module (the innermost running one), each q head's largest logit over
    every call it made (a module called twice, e.g. shared weights, keeps the larger), on
    the device the probe measured it on."""
    maxima: dict[str, torch.Tensor] = {}
    for capture in captures:
        if capture.head_logit_max is None or not capture.modules:
            continue
        name, value = capture.modules[-1], capture.head_logit_max.detach().float()
        before = maxima.get(name)
        same = before is not None and before.shape == value.shape
        maxima[name] = torch.maximum(before, value) if same else value
    return maxima


def head_factors(
    head_max: torch.Tensor, n_kv_heads: int, tau: float
) -> tuple[list[float], list[float]] | None:
    """(q factors per q head, k factors per k head), or None when no head exceeds tau."""
    floored = torch.nan_to_num(head_max.double(), nan=-math.inf).clamp_min(tau)
    if not bool((floored > tau).any()):
        return None
    own = torch.sqrt(tau / floored)  # exactly 1 for the heads at or under tau
    group = own.reshape(n_kv_heads, -1).amin(dim=1)  # the group's most-exceeding head
    return own.tolist(), group.tolist()


def _linear(module: nn.Module, name: str) -> nn.Linear | None:
    child = getattr(module, name, None)
    return child if isinstance(child, nn.Linear) else None


def _split(rows: int, heads: int) -> int | None:
    return rows // heads if heads > 0 and rows % heads == 0 else None


def _mha_layout(module: nn.MultiheadAttention, n_heads: int) -> QKLayout:
    e, d = module.embed_dim, module.head_dim
    bias = module.in_proj_bias.detach() if module.in_proj_bias is not None else None
    if module.in_proj_weight is not None:  # one [q; k; v] matrix, and its bias
        w = module.in_proj_weight
        return QKLayout(w, w, n_heads, n_heads, d, k_start=e, q_bias=bias, k_bias=bias)
    # kdim != embed_dim: the weights apart, the bias still one [q; k; v]
    k_bias = bias[e:] if bias is not None else None
    q, k = module.q_proj_weight, module.k_proj_weight
    return QKLayout(q, k, n_heads, n_heads, d, q_bias=bias, k_bias=k_bias)


def find_layout(module: nn.Module, n_heads: int) -> QKLayout | str:
    """The layout of a module whose attention call had ``n_heads`` q heads, or why not."""
    norms = [n for n in _QK_NORMS if not isinstance(getattr(module, n, nn.Identity()), nn.Identity)]
    if norms:
        return f"qk-norm ({', '.join(norms)}) undoes any scale of W_q and W_k"
    if isinstance(module, nn.MultiheadAttention):
        return _mha_layout(module, n_heads)
    q, k = _linear(module, "q_proj"), _linear(module, "k_proj")
    if q is not None and k is not None:
        head_dim = _split(q.out_features, n_heads)
        n_kv = _split(k.out_features, head_dim) if head_dim else None
        if head_dim and n_kv and n_heads % n_kv == 0:
            return QKLayout(
                q.weight, k.weight, n_heads, n_kv, head_dim, q_bias=q.bias, k_bias=k.bias
            )
        rows = f"({q.out_features}, {k.out_features})"
        return f"q_proj/k_proj rows {rows} do not split into {n_heads} heads"
    n_kv = _kv_heads(module, n_heads)
    for name in _FUSED:
        found = _fused_layout(getattr(module, name, None), name, n_heads, n_kv)
        if found is not None:
            return found
    return "no q_proj/k_proj, qkv, c_attn, query_key_value or in_proj_weight"


def _kv_heads(module: nn.Module, n_heads: int) -> int:
    """The module's own count of key/value heads (grouped-query attention: ``n_kv_head``
    and its spellings, on it or its ``config``), else ``n_heads`` (multi-head)."""
    for owner in (module, getattr(module, "config", None)):
        for key in _KV_HEAD_KEYS:
            value = getattr(owner, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return n_heads


def _fused_layout(
    child: object, name: str, n_heads: int, n_kv: int
) -> QKLayout | str | None:  # fmt: skip
    """[q; k; v] in one layer (q: ``n_heads`` heads, k and v ``n_kv`` each): an
    ``nn.Linear``, or GPT-2's ``Conv1D`` (weight (in, out))."""
    if isinstance(child, nn.Linear):
        axis = 0
    elif type(child).__name__ == "Conv1D" and getattr(child, "nf", None) == child.weight.size(1):
        axis = 1
    else:
        return None
    w, b = child.weight, child.bias
    rows, parts = w.size(axis), n_heads + 2 * n_kv
    head_dim = rows // parts if rows % parts == 0 and n_heads % n_kv == 0 else None
    if head_dim is None:
        return f"{name} has {rows} outputs: not [q; k; v] of {n_heads} q and {n_kv} kv heads"
    if name == "query_key_value":  # GPT-NeoX: per head [q_h; k_h; v_h]
        if n_kv != n_heads:
            return f"{name} interleaves heads; {n_kv} kv heads for {n_heads} q heads"
        start, stride = head_dim, 3 * head_dim
    else:
        start, stride = n_heads * head_dim, head_dim
    return QKLayout(
        w, w, n_heads, n_kv, head_dim, k_start=start, q_bias=b, k_bias=b,
        head_stride=stride, axis=axis,
    )  # fmt: skip


def _scale_heads(
    tensor: torch.Tensor | None, start: int, layout: QKLayout, factors: list[float], axis: int
) -> None:
    if tensor is None:
        return
    for head, factor in enumerate(factors):
        if factor < 1.0:
            tensor.data.narrow(axis, start + head * layout.stride, layout.head_dim).mul_(factor)


class QKClip:
    """Plans (rank 0, from a probe pass) and applies (every rank) per-head QK-clips;
    ``mode`` (``GuardPolicy.qk_clip``) says at which steps (:meth:`plan_after`)."""

    def __init__(
        self, model: nn.Module, tau: float, mapping: QKMapping = None, mode: str = "always"
    ) -> None:
        if mapping is not None and not (callable(mapping) or isinstance(mapping, Mapping)):
            raise TypeError(
                f"qk_layouts must be a dict of module name -> QKLayout or a callable "
                f"(name, module) -> QKLayout | None, got {type(mapping).__name__}"
            )
        self.model, self.tau, self.mapping, self.mode = model, float(tau), mapping, mode
        self._modules = dict(model.named_modules())
        self._layouts: dict[str, QKLayout | None] = {}
        self._warned = False

    def _user_layout(self, name: str) -> QKLayout | None:
        if isinstance(self.mapping, Mapping):
            return self.mapping.get(name)
        return self.mapping(name, self._modules[name]) if self.mapping is not None else None

    def layout(self, name: str, n_heads: int) -> QKLayout | None:
        """The module's layout (cached), or None with one warning for the run."""
        if name in self._layouts:
            return self._layouts[name]
        found = self._user_layout(name) if name in self._modules else None
        if found is None and name in self._modules:
            found = find_layout(self._modules[name], n_heads)
        if isinstance(found, str) or found is None:
            self._warn(name, found or "not a module of the guarded model")
            found = None
        elif found.n_heads != n_heads:
            self._warn(name, f"its layout has {found.n_heads} q heads, the call {n_heads}")
            found = None
        self._layouts[name] = found
        return found

    def _warn(self, name: str, why: str) -> None:
        if self._warned:
            return
        self._warned = True
        kind = type(self._modules.get(name, self.model)).__name__
        warnings.warn(
            f"collapse-guard QK-clip: the attention of {name or '<model>'!r} ({kind}) is not "
            f"clipped: {why}. Give Guard(qk_layouts={{name: QKLayout(...)}}) to say where its "
            "q and k heads are. This warning is given once.",
            RuntimeWarning,
            stacklevel=4,
        )

    def acts(self, level: Level, rescues: int) -> bool:
        """Whether the mode clips at a step of ``level`` with ``rescues`` rescues so far:
        "always", "watch" at watch or above, "rescue" from the first rescue on."""
        if self.mode == "watch":
            return level >= WATCH
        if self.mode == "rescue":
            return rescues > 0
        return self.mode == "always"

    def plan_after(
        self,
        probe_pass: Any,
        level: Level,
        rescues: int,
        rescue: bool = False,
        maxima_of: Mapping[str, np.ndarray] | None = None,
    ) -> QKPlan:
        """The plan from a step's probe pass (None: the step had none), {} where the mode
        does not act (:meth:`acts`) or the step is rescued (its rollback replaces the
        weights the pass read); ``maxima_of``: as for :meth:`plan`."""
        if probe_pass is None or rescue or not self.acts(level, rescues):
            return {}
        return self.plan(probe_pass.attention, maxima_of)

    def plan(
        self,
        captures: Sequence[AttentionCapture],
        maxima_of: Mapping[str, np.ndarray] | None = None,
    ) -> QKPlan:
        """The factors for every module with a head over tau (empty: nothing to do). A
        layout is looked for only where a head is over tau: a healthy run whose heads stay
        under it hears nothing of a module the clip could not reach. ``maxima_of``: the
        captures' :func:`head_maxima` already on the host (a deferred step's copy)."""
        plan: QKPlan = {}
        if maxima_of is None:  # one copy for every module (on a GPU: one sync, not one each)
            maxima_of = HostCopy(head_maxima(captures)).read()
        if captures and not maxima_of:
            self._warn("", "the probe's attention_fn returns no per-head logits and modules")
        for name, maxima in maxima_of.items():
            if not (maxima > self.tau).any():  # NaN compares False: nothing to clip
                continue
            layout = self.layout(name, maxima.size)
            factors = (
                head_factors(torch.from_numpy(maxima), layout.n_kv_heads, self.tau)
                if layout
                else None
            )
            if factors is not None:
                plan[name] = factors
        return plan

    @torch.no_grad()
    def apply(self, plan: QKPlan) -> list[str]:
        """Scale the planned heads' q and k rows; one event per q head whose logit moves."""
        events = []
        for name, (q_factors, k_factors) in plan.items():
            layout = self._layouts.get(name)
            if layout is None:  # a plan from another process (DDP, resume): find it again
                layout = self.layout(name, len(q_factors))
            if layout is None:
                continue
            _scale_heads(layout.q_weight, layout.q_start, layout, q_factors, layout.axis)
            _scale_heads(layout.q_bias, layout.q_start, layout, q_factors, 0)
            _scale_heads(layout.k_weight, layout.k_start, layout, k_factors, layout.axis)
            _scale_heads(layout.k_bias, layout.k_start, layout, k_factors, 0)
            group = len(q_factors) // len(k_factors)
            for head, q in enumerate(q_factors):
                factor = q * k_factors[head // group]
                if factor < 1.0:
                    events.append(f"qk_clip:{name}.{head}x{factor:.4g}")
        return events
