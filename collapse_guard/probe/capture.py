"""Reaching into a model without its help: the probe batch, the logits, the attention.

* :class:`BatchCapture` keeps a couple of sequences of the first training forward's
  inputs (a forward pre-hook that removes itself), cloned so later in-place changes to
  the loader's buffers cannot alter them.
* :class:`LogitsTap` is a forward hook on the logits layer: during training it keeps
  the running max |logit| on the device (no sync); during a probe pass it keeps the
  logits themselves.
* :func:`capture_attention` patches ``torch.nn.functional.scaled_dot_product_attention``
  for the duration of a probe pass only: the model gets the original function's output,
  and the probabilities are computed explicitly from ``q``, ``k``, the mask, the causal
  flag and the scale. ``nn.MultiheadAttention`` is steered onto that same function (its
  ``need_weights=False`` path; weights asked for by the caller are rebuilt from the
  capture), with PyTorch's fused "fast path" switched off for the pass.
* :func:`isolated` is the sandbox every probe-side forward runs in: eval mode (restored
  module by module afterwards), forked RNG, no grad unless asked, and eager: a model under
  ``torch.compile`` runs the pass uncompiled, since the pass's grad mode, eval mode and
  hooks each fail a guard of the training graph, and eight recompiles would leave the
  user's training forward eager for the rest of the run (dynamo's recompile limit).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

__all__ = [
    "UNREACHED_LAYOUT",
    "UNREACHED_NONE",
    "AttentionCapture",
    "BatchCapture",
    "LogitsTap",
    "ProbePass",
    "capture_attention",
    "isolated",
    "normalize_batch",
    "run_probe_pass",
]

# why a probe pass reached no attention (the probe's one warning says so)
UNREACHED_NONE = (
    "the probe pass made no call to F.scaled_dot_product_attention or nn.MultiheadAttention: "
    "the model computes softmax(QK^T) by hand (transformers' attn_implementation='eager' "
    "does); load it with attn_implementation='sdpa', or give Probe(attention_fn=...)"
)
UNREACHED_LAYOUT = (
    "an attention call's inputs have a layout the probe cannot follow; give Probe(attention_fn=...)"
)

_MHA_ARG_NAMES = (
    "query",
    "key",
    "value",
    "key_padding_mask",
    "need_weights",
    "attn_mask",
    "average_attn_weights",
    "is_causal",
)


@dataclass
class AttentionCapture:
    """One attention call of a probe pass.

    ``probs`` is (batch, heads, queries, keys), float32, rows summing to 1 (fully
    masked rows are all 0). ``logit_max`` is the largest unmasked pre-softmax logit
    (scale and additive mask included), ``head_logit_max`` the same per head (heads,),
    ``outputs`` the per-head outputs (batch, heads, queries, head_dim). ``modules``
    names the modules whose forward was running at the call, outermost first (the last
    is the one that called attention: QK-clip finds the head's parameters from it). A
    user ``attention_fn`` may return bare probability tensors; the missing fields then
    give NaN for their signals.
    """

    probs: torch.Tensor
    logit_max: torch.Tensor | None = None
    outputs: torch.Tensor | None = None
    head_logit_max: torch.Tensor | None = None
    modules: tuple[str, ...] = ()


@dataclass
class ProbePass:
    """What one pass of the probe batch produced; ``attention`` empty when unreachable,
    and then ``unreached`` says why ("" when the pass did not look, or failed)."""

    attention: list[AttentionCapture]
    logits: torch.Tensor | None
    unreached: str = ""


def normalize_batch(batch: Any) -> tuple[tuple, dict]:
    """A probe batch as ``(args, kwargs)``: a tensor, a tuple/list of args, or a dict of kwargs."""
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    if isinstance(batch, dict):
        return (), dict(batch)
    raise TypeError(
        f"probe_batch must be a tensor, a tuple/list of positional inputs or a dict of "
        f"keyword inputs, got {type(batch).__name__}; pass what the model's forward takes"
    )


class BatchCapture:
    """Keeps the first ``size`` rows of the first forward's tensor inputs, then unhooks.

    Every tensor input of at least one dimension is cut to its first ``size`` rows;
    2-D integer/bool tensors (token ids, targets, attention masks) are also cropped to
    ``seq_len`` positions. Non-tensor inputs are kept as they are.
    """

    def __init__(self, model: nn.Module, size: int, seq_len: int) -> None:
        self.size, self.seq_len = size, seq_len
        self.batch: tuple[tuple, dict] | None = None
        self._handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _cut(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        value = value.detach()
        if value.dim() >= 1:
            value = value[: self.size]
        if value.dim() == 2 and not value.is_floating_point():
            value = value[:, : self.seq_len]
        return value.clone()

    def _hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.batch = pytree.tree_map(self._cut, (args, kwargs))
        self.remove()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


class LogitsTap:
    """Forward hook on the logits layer: running max |logit| in training, logits in a pass."""

    def __init__(self, module: nn.Module) -> None:
        self.running: torch.Tensor | None = None
        self.pass_logits: torch.Tensor | None = None
        self.mode = "train"  # "train" | "pass" (keep logits) | "off" (ignore, e.g. sharpness)
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: tuple, output: Any) -> None:
        if not isinstance(output, torch.Tensor) or output.numel() == 0 or self.mode == "off":
            return
        if self.mode == "pass":
            self.pass_logits = output.detach().float()
            return
        with torch.no_grad():
            top = output.detach().abs().amax().float()
            # torch.maximum keeps NaN: a non-finite logit is data, not noise
            self.running = top if self.running is None else torch.maximum(self.running, top)

    def take(self) -> torch.Tensor | None:
        """Max |logit| over the training forwards since the last take (device tensor)."""
        value, self.running = self.running, None
        return value

    def remove(self) -> None:
        self._handle.remove()


def _explicit_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> AttentionCapture:
    """Attention probabilities as SDPA defines them, computed in float32."""
    q, k, v = query.float(), key.float(), value.float()
    if enable_gqa and k.size(-3) != q.size(-3):
        repeat = q.size(-3) // k.size(-3)
        k, v = k.repeat_interleave(repeat, dim=-3), v.repeat_interleave(repeat, dim=-3)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    logits = (q @ k.transpose(-2, -1)) * scale
    n_query, n_key = logits.shape[-2:]
    allowed = None
    if is_causal:
        # SDPA's causal mask is top-left aligned: query i sees keys 0..i
        allowed = torch.ones(n_query, n_key, dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = attn_mask if allowed is None else allowed & attn_mask
        else:
            logits = logits + attn_mask.float()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, -math.inf)
    # a row with every key masked is NaN after softmax; it attends to nothing: zeros
    probs = torch.softmax(logits, dim=-1).nan_to_num(nan=0.0)
    finite = torch.where(torch.isfinite(logits), logits, -math.inf)
    heads = probs.size(-3) if probs.dim() >= 3 else 1
    shape = (-1, heads, n_query)
    outputs = probs @ v
    head_max = finite.reshape(-1, heads, n_query * n_key).amax(dim=(0, 2))
    return AttentionCapture(
        probs=probs.reshape(*shape, n_key),
        logit_max=head_max.amax(),
        outputs=outputs.reshape(*shape, outputs.size(-1)),
        head_logit_max=head_max,
    )


def _sdpa_capturing(
    original: Callable, sink: list[AttentionCapture | None], running: list[str]
) -> Callable:
    def scaled_dot_product_attention(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw
    ):
        # the model gets exactly what the real function returns
        out = original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kw)
        try:
            capture = _explicit_attention(
                query, key, value, attn_mask, is_causal, scale, kw.get("enable_gqa", False)
            )
            capture.modules = tuple(running)
            sink.append(capture)
        except Exception:  # an input layout we cannot follow: NaN, never a training error
            sink.append(None)
        return out

    return scaled_dot_product_attention


def _mha_hooks(module: nn.MultiheadAttention, sink: list) -> list:
    asked: list[tuple[bool, bool, bool]] = []  # (need_weights, average, batched) per call

    def pre(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = {**dict(zip(_MHA_ARG_NAMES[3:], args[3:], strict=False)), **kwargs}
        batched = args[0].dim() == 3 if args else kwargs["query"].dim() == 3
        asked.append(
            (kwargs.get("need_weights", True), kwargs.get("average_attn_weights", True), batched)
        )
        # need_weights=False sends MHA through F.scaled_dot_product_attention: captured there
        kwargs["need_weights"] = False
        return args[:3], kwargs

    def post(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        need, average, batched = asked.pop()
        if not need:
            return None
        last = sink[-1] if sink else None
        if last is None:
            return output[0], None
        weights = last.probs.mean(dim=1) if average else last.probs
        return output[0], weights if batched else weights.squeeze(0)

    return [
        module.register_forward_pre_hook(pre, with_kwargs=True),
        module.register_forward_hook(post, with_kwargs=True),
    ]


def _running_hooks(model: nn.Module, running: list[str]) -> list:
    """Keep ``running`` = the names of the modules inside whose forward we are."""

    def leave(module: nn.Module, args: tuple, output: Any) -> None:
        running.pop()  # a hook's return value would replace the module's output

    handles = []
    for name, module in model.named_modules():

        def enter(module: nn.Module, args: tuple, name: str = name) -> None:
            running.append(name)

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave, always_call=True))
    return handles


@contextlib.contextmanager
def capture_attention(model: nn.Module) -> Iterator[list[AttentionCapture | None]]:
    """Within the block, every SDPA call (and every ``nn.MultiheadAttention``) is recorded."""
    sink: list[AttentionCapture | None] = []
    running: list[str] = []
    original = F.scaled_dot_product_attention
    handles = _running_hooks(model, running)
    for module in model.modules():
        if isinstance(module, nn.MultiheadAttention):
            handles += _mha_hooks(module, sink)
    F.scaled_dot_product_attention = _sdpa_capturing(original, sink, running)
    try:
        yield sink
    finally:
        F.scaled_dot_product_attention = original
        for handle in handles:
            handle.remove()


def _eager() -> contextlib.AbstractContextManager:
    """Compiled code runs as plain eager code within (torch >= 2.6; before, a no-op)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance else contextlib.nullcontext()


@contextlib.contextmanager
def isolated(model: nn.Module, *, grad: bool = False) -> Iterator[None]:
    """Run probe-side forwards without touching training: eval, forked RNG, no grad."""
    modes = [(module, module.training) for module in model.modules()]
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    fastpath = torch.backends.mha.get_fastpath_enabled()
    fork = (
        torch.random.fork_rng(devices=cuda, device_type="cuda")
        if cuda
        else torch.random.fork_rng(devices=[])
    )
    with fork, torch.set_grad_enabled(grad), _eager():
        model.eval()
        # the fused MHA / TransformerEncoderLayer kernels bypass the functions we capture
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            yield
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
            for module, training in modes:
                module.training = training


def _as_captures(items: Sequence[Any]) -> list[AttentionCapture]:
    captures = []
    for item in items:
        if isinstance(item, AttentionCapture):
            captures.append(item)
        elif isinstance(item, torch.Tensor):
            probs = item.detach().float()
            heads = probs.size(-3) if probs.dim() >= 3 else 1
            captures.append(AttentionCapture(probs.reshape(-1, heads, *probs.shape[-2:])))
        else:
            raise TypeError(
                f"attention_fn must return tensors of attention probabilities (..., heads, "
                f"queries, keys) or AttentionCapture objects, got {type(item).__name__}"
            )
    return captures


def run_probe_pass(
    model: nn.Module,
    batch: tuple[tuple, dict] | None,
    tap: LogitsTap | None,
    attention_fn: Callable[[nn.Module], Sequence[Any]] | None = None,
) -> ProbePass:
    """One forward of the probe batch (or the user's ``attention_fn``) in the sandbox."""
    if tap is not None:
        tap.mode, tap.pass_logits = "pass", None
    unreached = ""
    try:
        with isolated(model), capture_attention(model) as sink:
            if attention_fn is not None:
                captures = _as_captures(attention_fn(model))
            elif batch is not None:
                args, kwargs = batch
                model(*args, **kwargs)
                # one call we could not follow spoils the set: its heads would be missing
                captures = [] if any(c is None for c in sink) else list(sink)
                if not sink:
                    unreached = UNREACHED_NONE
                elif not captures:
                    unreached = UNREACHED_LAYOUT
            else:
                captures = []
    except Exception as error:  # observe only: a failing probe pass must not stop training
        warnings.warn(
            f"collapse-guard probe pass failed ({type(error).__name__}: {error}); attention "
            "and probe-batch output signals are NaN this step. Give Probe(probe_batch=...) "
            "or attention_fn=... to fix it",
            RuntimeWarning,
            stacklevel=3,
        )
        captures = []
    finally:
        logits = None
        if tap is not None:
            logits, tap.pass_logits, tap.mode = tap.pass_logits, None, "train"
    return ProbePass(attention=captures, logits=logits, unreached=unreached)
