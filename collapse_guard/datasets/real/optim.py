"""The optimizers of the real runs: AdamW, Lion, SGD with momentum and Muon, built from a config.

Weight decay goes to matrices only, as in nanoGPT (norm gains, biases and nothing
else of dimension < 2 are left alone), for every optimizer alike.

Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2)
is not in torch; ``Lion`` below is its update, written out::

    c = beta1 * m + (1 - beta1) * g          # interpolation used for the step
    p = p * (1 - lr * wd) - lr * sign(c)     # decoupled weight decay, then the sign step
    m = beta2 * m + (1 - beta2) * g          # the momentum kept for the next step

Every coordinate moves by exactly ``lr`` (or 0 where ``c`` is 0), so its failure at
high LR is a uniform push on every weight rather than AdamW's rare huge
``m / sqrt(v)`` updates. The paper advises an LR 3-10x below AdamW's; on these small
models the measured edges are closer (Lion 0.03, AdamW 0.04: ``sampler.STABLE_EDGE``),
but Lion grows attention logits steadily even well below its edge (measured at 0.003:
the largest logit ~4,000 by step 500 while the loss still fell).

Muon is torch's own (``torch.optim.Muon``, Jordan et al. 2024) on the hidden 2-D
matrices, with AdamW on the rest (embeddings, head, norms, biases), as Muon is used:
``MuonAdamW`` steps the two as one optimizer, so the loop, the probe (``lr`` from
``param_groups[0]``) and the faults see one. Its LR is scaled to AdamW's update RMS
(``adjust_lr_fn="match_rms_adamw"``, Liu et al. 2025, "Muon is Scalable for LLM
Training"), so one LR and one weight decay serve both halves and the recipes' LR
schedules mean the same for it as for AdamW.
"""

from __future__ import annotations

import torch

from collapse_guard._chained import ChainedOptimizer, closure_loss

__all__ = ["Lion", "MuonAdamW", "build_optimizer"]


class Lion(torch.optim.Optimizer):
    """Lion: sign of an interpolated momentum, decoupled weight decay (module docstring)."""

    def __init__(
        self,
        params,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ):
        if lr < 0:
            raise ValueError(f"Lion lr must be >= 0, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Lion betas must lie in [0, 1), got {betas}")
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, decay = group["lr"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param)
                momentum = state["exp_avg"]
                if decay:
                    param.mul_(1.0 - lr * decay)
                param.add_(torch.lerp(grad, momentum, beta1).sign_(), alpha=-lr)
                momentum.lerp_(grad, 1.0 - beta2)
        return loss


class MuonAdamW(ChainedOptimizer):
    """torch's Muon on ``muon_groups``, AdamW on ``adamw_groups``, stepped as one optimizer.

    A ``ChainedOptimizer`` of the two (``collapse_guard._chained``): its ``param_groups``
    are the two optimizers' own group dicts (Muon's first), so an LR set on them reaches
    both, after a restore too; ``state`` is the union of the two states.
    Muon's momentum is ``momentum`` (Nesterov), AdamW's betas ``betas``.
    """

    def __init__(
        self,
        muon_groups: list[dict],
        adamw_groups: list[dict],
        *,
        lr: float,
        momentum: float = 0.95,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
    ):
        super().__init__(
            torch.optim.Muon(muon_groups, lr=lr, momentum=momentum, adjust_lr_fn="match_rms_adamw"),
            torch.optim.AdamW(adamw_groups, lr=lr, betas=betas, eps=eps, fused=True),
        )

    @property
    def muon(self) -> torch.optim.Optimizer:
        return self.optimizers[0]

    @property
    def adamw(self) -> torch.optim.Optimizer:
        return self.optimizers[1]


def _hidden_matrices(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The 2-D weights inside the blocks: Muon's share (embeddings and the head are not)."""
    outside = {
        id(p)
        for module in model.modules()
        if isinstance(module, torch.nn.Embedding)
        for p in module.parameters()
    }
    head = getattr(model, "head", None)
    if isinstance(head, torch.nn.Linear):
        outside.add(id(head.weight))
    return [p for p in model.parameters() if p.dim() == 2 and id(p) not in outside]


def _muon_adamw(config, model: torch.nn.Module) -> MuonAdamW:
    hidden = _hidden_matrices(model)
    inside = {id(p) for p in hidden}
    rest = [p for p in model.parameters() if id(p) not in inside]
    adamw_groups = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    return MuonAdamW(
        [{"params": hidden, "weight_decay": config.weight_decay}],
        [group for group in adamw_groups if group["params"]],
        lr=config.lr_at(0),
        momentum=config.beta1,
        betas=(0.9, config.beta2),
        eps=config.eps,
    )


def build_optimizer(config, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``config.optimizer`` names, over ``model``'s parameters.

    ``config`` is a ``RealRunConfig``: its ``lr_at(0)``, betas, eps and weight decay.
    For Muon, ``beta1`` is Muon's momentum and ``beta2`` AdamW's on the rest.
    """
    if config.optimizer == "muon":
        return _muon_adamw(config, model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    lr = config.lr_at(0)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(
            groups,
            lr=lr,
            betas=(config.beta1, config.beta2),
            eps=config.eps,
            fused=True,  # one kernel for all tensors: 1.8 ms a step instead of 4.4 ms here
        )
    if config.optimizer == "lion":
        return Lion(groups, lr=lr, betas=(config.beta1, config.beta2))
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=config.beta1, nesterov=True)
    raise ValueError(
        f"optimizer={config.optimizer!r} is not known; expected adamw, lion, sgd or muon"
    )
