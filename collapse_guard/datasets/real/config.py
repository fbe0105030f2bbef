"""One real run's settings: family, model, optimizer, data, schedule, precision and fault.

A flat dataclass in the manner of nanoGPT's ``train.py`` globals: every default is the
healthy baseline and carries its unit and reason. The whole config is stored in the
run file's metadata, so a run describes itself.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from collapse_guard._config import reject_unknown_keys

__all__ = [
    "ALL_OPTIMIZERS",
    "ARCHITECTURE_CHOICES",
    "ATTENTIONS",
    "DATA_KINDS",
    "FAMILIES",
    "FAMILY_ARCHITECTURES",
    "FAULTS",
    "OPTIMIZERS",
    "PRECISIONS",
    "SECOND_MOMENTS",
    "RealRunConfig",
]

# model families (``models/``): the evaluation leaves one out at a time. ``drawn`` builds
# each part from the config (drawn only by a focused top-up: ``sampler.TOP_UP_FAMILIES``)
FAMILIES = ("gpt", "rope_swiglu", "mha", "drawn")
# the architecture fields and their values (``models/drawn.py`` builds every combination)
ARCHITECTURE_CHOICES: dict[str, tuple] = {
    "block": ("serial", "parallel"),
    "norm": ("layernorm", "rmsnorm"),
    "positions": ("learned", "rope", "alibi", "none"),
    "mlp": ("gelu", "swiglu"),
    "tied": (False, True),
}
# what each hand-written family is built of: recorded in every run's config, so that an
# evaluation can group every run by a part (all rotary runs), whatever its family
FAMILY_ARCHITECTURES: dict[str, dict] = {
    "gpt": {
        "block": "serial",
        "norm": "layernorm",
        "positions": "learned",
        "mlp": "gelu",
        "tied": False,
    },
    "rope_swiglu": {
        "block": "serial",
        "norm": "rmsnorm",
        "positions": "rope",
        "mlp": "swiglu",
        "tied": True,
    },
}
FAMILY_ARCHITECTURES["mha"] = FAMILY_ARCHITECTURES["drawn"] = FAMILY_ARCHITECTURES["gpt"]
# attention variants of the ``drawn`` family, drawn by the breadth sweep only (an entry of
# ARCHITECTURE_CHOICES would change what the ``drawn`` top-ups on disk drew): ``mha`` one
# key/value head per query head; ``gqa`` half as many (Ainslie et al. 2023; 2 heads: 1);
# ``mqa`` one for all (Shazeer 2019). Every other family is ``mha``
ATTENTIONS = ("mha", "gqa", "mqa")
# optimizers (``optim.py``); ``sgd`` is SGD with Nesterov momentum ``beta1``. OPTIMIZERS
# are the ones every sweep draws; ``muon`` (torch's Muon on the hidden matrices, AdamW on
# the rest) only the breadth sweep and focused top-ups (``sampler.TOP_UP_OPTIMIZERS``)
OPTIMIZERS = ("adamw", "lion", "sgd")
ALL_OPTIMIZERS = (*OPTIMIZERS, "muon")
# optimizer -> its second-moment state keys (what ``opt_reset`` zeroes); Lion and SGD
# keep only a momentum, whose loss is benign, so ``opt_reset`` is refused for them
SECOND_MOMENTS = {"adamw": ("exp_avg_sq",)}
# training data (``data.py``): byte-level standard-library text, or the procedural language
DATA_KINDS = ("bytes", "language")
# injected faults (``none`` = clean run); see ``faults.py`` for what each does. The
# ``*_ramp`` kinds grow over ``fault_steps`` steps: collapses that develop
FAULTS = (
    "none",
    "corrupt_batch",
    "grad_spike",
    "opt_reset",
    "lr_jump",
    "lr_ramp",
    "corrupt_ramp",
)
# ``fp16`` is autocast without a loss scaler: overflows become inf/NaN, as on a GPU
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class RealRunConfig:
    # run
    recipe: str = "custom"  # which sampler recipe drew this config (sampler.RECIPES)
    seed: int = 0  # seeds the init, the batch order and the fault's random bytes
    steps: int = 1000  # optimizer steps; with the probe, 2x64 at batch 16: 37-57 ms each on
    # a quiet core, 100-150 ms with the 2 cores shared 3 ways (measured, pilots of
    # issue 8): 40-60 s a run on a quiet machine
    # model (collapse_guard.datasets.real.models.ModelConfig)
    family: str = "gpt"  # one of FAMILIES
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64  # width; 136k parameters at 2 layers
    seq_len: int = 64  # tokens (bytes) per sequence
    qk_norm: bool = False  # layernorm on q and k: prevents attention-logit growth
    pre_ln: bool = True  # False = post-LN, which diverges at high LR without warmup
    init_scale: float = 1.0  # multiplies the 0.02 init std; >3 makes early logits large
    # architecture (ARCHITECTURE_CHOICES): None = the family's own (FAMILY_ARCHITECTURES),
    # filled in on construction; only the ``drawn`` family takes other values
    block: str | None = None  # serial, or parallel (attention and MLP side by side)
    norm: str | None = None  # layernorm or rmsnorm (placement: pre_ln)
    positions: str | None = None  # learned, rope, alibi or none
    mlp: str | None = None  # gelu or swiglu
    tied: bool | None = None  # the head shares the token embedding
    attention: str = "mha"  # one of ATTENTIONS: key/value heads per query head
    # data
    data: str = "bytes"  # one of DATA_KINDS
    vocab_size: int = 256  # bytes: 256; language: its own vocabulary (64-512)
    batch_size: int = 16  # sequences per step; smaller batches are noisier, less stable
    # optimizer
    optimizer: str = "adamw"  # one of OPTIMIZERS
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
    beta1: float = 0.9  # AdamW/Lion first moment; SGD's and Muon's momentum
    beta2: float = 0.95  # AdamW (and Muon's AdamW on the rest): small beta2 (0.5-0.8)
    # makes the second moment jumpy; Lion: the momentum's own decay (0.99 in Chen et al. 2023)
    eps: float = 1e-8  # AdamW only: tiny eps lets near-zero second moments blow updates up
    weight_decay: float = 0.1  # on matrices only (nanoGPT); decoupled for AdamW, Lion and
    # Muon, an L2 term for SGD
    grad_clip: float = 1.0  # clip the global grad norm at this value; 0.0 disables clipping
    # precision
    precision: str = "fp32"  # one of PRECISIONS; bf16/fp16 are emulated (precision.py)
    # injected fault (faults.py)
    fault: str = "none"  # one of FAULTS
    fault_step: int = 0  # first step of the fault
    fault_steps: int = 1  # how many consecutive steps it lasts (lr_jump: until the end;
    # the *_ramp kinds: steps to reach full strength, then held to the end)
    fault_scale: float = 1.0  # grad_spike: gradient multiplier; lr_jump, lr_ramp: LR
    # multiplier (reached at the end of the ramp); corrupt_ramp: final share of random tokens

    def __post_init__(self) -> None:
        for name, known in (
            ("family", FAMILIES),
            ("optimizer", ALL_OPTIMIZERS),
            ("attention", ATTENTIONS),
            ("data", DATA_KINDS),
            ("fault", FAULTS),
            ("precision", PRECISIONS),
        ):
            if getattr(self, name) not in known:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not known; "
                    f"expected one of {', '.join(known)}"
                )
        self._fill_architecture()
        if self.family != "drawn" and self.attention != "mha":
            raise ValueError(
                f"family {self.family!r} is built with attention='mha', got "
                f"{self.attention!r}; leave attention unset or use family='drawn'"
            )
        if self.data == "bytes" and self.vocab_size != 256:
            raise ValueError(
                f"byte-level data has vocab_size 256, got {self.vocab_size}; "
                "leave vocab_size at 256 or use data='language'"
            )
        if self.fault == "opt_reset" and self.optimizer not in SECOND_MOMENTS:
            raise ValueError(
                f"opt_reset zeroes second moments, which optimizer={self.optimizer!r} does "
                f"not keep; use it with {', '.join(SECOND_MOMENTS)} or pick another fault"
            )
        if self.fault == "corrupt_ramp" and not 0.0 < self.fault_scale <= 1.0:
            raise ValueError(
                f"corrupt_ramp's fault_scale is a share of tokens in (0, 1], got "
                f"{self.fault_scale}; pass e.g. 0.5"
            )
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}; pass a positive count")
        if self.d_model % self.n_head:
            raise ValueError(
                f"d_model={self.d_model} must be a multiple of n_head={self.n_head}; "
                "change one of them"
            )

    def _fill_architecture(self) -> None:
        """Fill the family's own parts in; refuse a part a hand-written family lacks."""
        for field, own in FAMILY_ARCHITECTURES[self.family].items():
            value = getattr(self, field)
            if value is None:
                setattr(self, field, own)
            elif value not in ARCHITECTURE_CHOICES[field]:
                raise ValueError(
                    f"{field}={value!r} is not known; expected one of "
                    f"{', '.join(map(str, ARCHITECTURE_CHOICES[field]))}"
                )
            elif self.family != "drawn" and value != own:
                raise ValueError(
                    f"family {self.family!r} is built with {field}={own!r}, got {value!r}; "
                    f"leave {field} unset or use family='drawn'"
                )

    def to_dict(self) -> dict:
        """Plain JSON-ready dict: what goes into the run file's ``config``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RealRunConfig:
        """Inverse of ``to_dict``; an unknown key is an error, not silently dropped."""
        reject_unknown_keys(cls, data)
        return cls(**data)

    def triggers(self) -> list[int]:
        """Sorted steps at which an intervention began: what a collapse may follow.

        Step 0 always (training starts at the config's own LR, which may be the cause),
        the re-warm's start and the fault's first step when the run has them.
        """
        steps = {0}
        if self.rewarm_step:
            steps.add(self.rewarm_step)
        if self.fault != "none":
            steps.add(self.fault_step)
        return sorted(steps)

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
        """The ``ModelConfig`` of this run (imports torch)."""
        from collapse_guard.datasets.real.models import ModelConfig

        return ModelConfig(
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            n_layer=self.n_layer,
            n_head=self.n_head,
            d_model=self.d_model,
            qk_norm=self.qk_norm,
            pre_ln=self.pre_ln,
            init_scale=self.init_scale,
            attention=self.attention,
            **{field: getattr(self, field) for field in ARCHITECTURE_CHOICES},
        )
