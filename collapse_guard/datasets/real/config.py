"""One real run's settings: model, optimizer, schedule, precision and injected fault.

A flat dataclass in the manner of nanoGPT's ``train.py`` globals: every default is the
healthy baseline and carries its unit and reason. The whole config is stored in the
run file's metadata, so a run describes itself.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from collapse_guard._config import reject_unknown_keys

__all__ = ["FAULTS", "PRECISIONS", "RealRunConfig"]

# injected faults (``none`` = clean run); see ``faults.py`` for what each does
FAULTS = ("none", "corrupt_batch", "grad_spike", "opt_reset", "lr_jump")
# ``fp16`` is autocast without a loss scaler: overflows become inf/NaN, as on a GPU
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class RealRunConfig:
    # run
    recipe: str = "custom"  # which sampler recipe drew this config (sampler.RECIPES)
    seed: int = 0  # seeds the init, the batch order and the fault's random bytes
    steps: int = 600  # optimizer steps; ~50 ms each with the probe on a busy 2-core machine:
    # ~30 s a run, so 200 runs take ~50 min on 2 workers
    # model (collapse_guard.datasets.real.model.GPTConfig)
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64  # width; 136k parameters at 2 layers
    seq_len: int = 64  # tokens (bytes) per sequence
    qk_norm: bool = False  # layernorm on q and k: prevents attention-logit growth
    pre_ln: bool = True  # False = post-LN, which diverges at high LR without warmup
    init_scale: float = 1.0  # multiplies the 0.02 init std; >3 makes early logits large
    # data
    batch_size: int = 16  # sequences per step; smaller batches are noisier, less stable
    # adamw optimizer
    lr: float = 3e-3  # peak learning rate; >= ~0.05 collapses attention without qk_norm
    warmup_steps: int = 100  # linear warmup from 0 to lr, then cosine decay
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at the last step
    # re-warming (continued pre-training, Gupta et al. 2023): at rewarm_step the LR ramps
    # linearly to rewarm_lr over rewarm_steps, then decays by cosine to rewarm_lr *
    # min_lr_ratio. A model that learned at a safe LR collapses visibly when re-warmed
    # past ~0.05 (a loss rise), where one warmed to that LR at once only plateaus
    rewarm_step: int = 0  # 0 = no re-warming
    rewarm_steps: int = 1  # ramp length, steps
    rewarm_lr: float = 0.0  # second peak LR
    beta1: float = 0.9
    beta2: float = 0.95  # small beta2 (0.5-0.8) makes the second moment jumpy
    eps: float = 1e-8  # tiny eps lets near-zero second moments blow updates up
    weight_decay: float = 0.1  # decoupled (AdamW), on matrices only (nanoGPT)
    grad_clip: float = 1.0  # clip the global grad norm at this value; 0.0 disables clipping
    # precision
    precision: str = "fp32"  # one of PRECISIONS; bf16/fp16 are emulated (precision.py)
    # injected fault (faults.py)
    fault: str = "none"  # one of FAULTS
    fault_step: int = 0  # first step of the fault
    fault_steps: int = 1  # how many consecutive steps it lasts (lr_jump: until the end)
    fault_scale: float = 1.0  # grad_spike: gradient multiplier; lr_jump: LR multiplier

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(
                f"fault={self.fault!r} is not known; expected one of {', '.join(FAULTS)}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"precision={self.precision!r} is not known; "
                f"expected one of {', '.join(PRECISIONS)}"
            )
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}; pass a positive count")
        if self.d_model % self.n_head:
            raise ValueError(
                f"d_model={self.d_model} must be a multiple of n_head={self.n_head}; "
                "change one of them"
            )

    def to_dict(self) -> dict:
        """Plain JSON-ready dict: what goes into the run file's ``config``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RealRunConfig:
        """Inverse of ``to_dict``; an unknown key is an error, not silently dropped."""
        reject_unknown_keys(cls, data)
        return cls(**data)

    def lr_at(self, step: int) -> float:
        """Scheduled LR: warmup, cosine to ``lr * min_lr_ratio``; then any re-warming."""
        if self.rewarm_step and step >= self.rewarm_step:
            ramp = step - self.rewarm_step
            start = self._warmup_cosine(self.rewarm_step, self.lr, 0, self.warmup_steps)
            if ramp < self.rewarm_steps:
                return start + (self.rewarm_lr - start) * (ramp + 1) / self.rewarm_steps
            return self._warmup_cosine(step, self.rewarm_lr, self.rewarm_step, self.rewarm_steps)
        return self._warmup_cosine(step, self.lr, 0, self.warmup_steps)

    def _warmup_cosine(self, step: int, peak: float, begin: int, warmup: int) -> float:
        if step - begin < warmup:
            return peak * (step - begin + 1) / warmup
        progress = min(1.0, (step - begin - warmup) / max(1, self.steps - begin - warmup))
        floor = peak * self.min_lr_ratio
        return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))

    def model_config(self):
        """The ``GPTConfig`` of this run (imports torch)."""
        from collapse_guard.datasets.real.model import GPTConfig

        return GPTConfig(
            seq_len=self.seq_len,
            n_layer=self.n_layer,
            n_head=self.n_head,
            d_model=self.d_model,
            qk_norm=self.qk_norm,
            pre_ln=self.pre_ln,
            init_scale=self.init_scale,
        )
