"""Three training loops a user has, each guarded, written here as their authors write them.

- ``nanogpt_loop``: a GPT the way nanoGPT's ``model.py`` writes it (fused ``c_attn``,
  ``F.scaled_dot_product_attention``, tied embeddings, ``configure_optimizers`` with decay
  and no-decay groups) in a loop that sets ``param_group["lr"]`` itself every step, as its
  ``train.py`` does; ``guard.step(loss)`` in place of clipping and ``optimizer.step()``.
- ``llama_trainer``: transformers' ``LlamaForCausalLM`` from a tiny config under
  ``Trainer``, linear warmup from LR 0 (the Trainer's default scheduler shape).
- ``lightning_fit``: a ``LightningModule`` around ``nn.MultiheadAttention`` blocks, its LR
  from a torch scheduler that ``configure_optimizers`` returns.

Each writes one run file (source ``guarded``) into its own folder and returns a
:class:`ClientRun`. The data is the project's seeded procedural language (64 tokens), so
every loss falls from ln 64 = 4.16 and every run is the same on one machine. Module name
found in no other test folder (see ``tests/support.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["STEPS", "ClientRun", "lightning_fit", "llama_trainer", "nanogpt_loop"]

VOCAB, SEQ, BATCH = 64, 32, 8
# enough steps that a run has rows past one horizon (200): the bundled model reads a window
# of 200 steps, and a run the guard acted on is labelled only on steps a horizon before
STEPS = 260
WARMUP = 40


@dataclass(frozen=True)
class ClientRun:
    """One guarded run: its run file and the guard's summary."""

    name: str
    path: Path
    summary: dict
    lrs: list[float]  # the LR the loop or framework set, before the guard, per step


@functools.cache
def _tokens() -> torch.Tensor:
    from collapse_guard.datasets.real.language import load_language

    return torch.from_numpy(load_language(VOCAB).astype("int64"))


def _batch(text: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``BATCH`` windows of ``SEQ + 1`` tokens at seeded random offsets."""
    starts = torch.randint(len(text) - SEQ - 1, (BATCH,), generator=generator)
    return text[starts[:, None] + torch.arange(SEQ + 1)]


# ------------------------------------------------------------------- nanoGPT's shape


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)  # q, k, v fused
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd, bias=False),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer: int = 2, n_embd: int = 32, n_head: int = 2) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(VOCAB, n_embd),
                "wpe": nn.Embedding(SEQ, n_embd),
                "h": nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer)),
                "ln_f": nn.LayerNorm(n_embd),
            }
        )
        self.lm_head = nn.Linear(n_embd, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT does

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.size(1))
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def nanogpt_lr(it: int, learning_rate: float = 3e-3, min_lr: float = 3e-4) -> float:
    """nanoGPT's ``get_lr``: linear warmup, then cosine down to ``min_lr``."""
    if it < WARMUP:
        return learning_rate * (it + 1) / (WARMUP + 1)
    ratio = (it - WARMUP) / (STEPS - WARMUP)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def nanogpt_loop(folder: Path) -> ClientRun:
    from collapse_guard.guard import Guard

    torch.manual_seed(0)
    model = GPT()
    optimizer = model.configure_optimizers(0.1, nanogpt_lr(0), (0.9, 0.95))
    # fixed run ids: training splits runs by their sorted ids, so random ones made the
    # retrain test's split, levels and verdict change from session to session (3 of the 6
    # orders of these three runs promote its challenger, this one among them)
    guard = Guard(model, optimizer, folder, policy={"clip": 1.0}, run_id="client-1-nanogpt")
    text, generator = _tokens(), torch.Generator().manual_seed(0)
    lrs = []
    for it in range(STEPS):
        lr = nanogpt_lr(it)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        lrs.append(lr)
        batch = _batch(text, generator)
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        guard.step(loss)  # in place of clip_grad_norm_ and optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return ClientRun("nanogpt", guard.run_path, guard.summary(), lrs)


# ------------------------------------------------------------ transformers' Trainer


class _Rows(torch.utils.data.Dataset):
    """Seeded windows of the language, each its own labels (the Trainer's causal LM)."""

    def __init__(self, rows: int) -> None:
        text, generator = _tokens(), torch.Generator().manual_seed(1)
        starts = torch.randint(len(text) - SEQ, (rows,), generator=generator)
        self.ids = text[starts[:, None] + torch.arange(SEQ)]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def llama_trainer(folder: Path) -> ClientRun:
    import transformers

    from collapse_guard.integrations.huggingface import GuardCallback

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=SEQ,
    )
    model = transformers.LlamaForCausalLM(config)
    callback = GuardCallback(folder, run_id="client-3-llama")  # fixed: nanogpt_loop says why
    args = transformers.TrainingArguments(
        output_dir=str(folder / "trainer"),
        report_to=[],
        use_cpu=True,
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=3e-3,
        warmup_steps=WARMUP,  # linear from 0: the run file's first LR is 0
        lr_scheduler_type="linear",
        max_grad_norm=1.0,
        logging_steps=STEPS,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    lrs: list[float] = []

    class SchedulerLr(transformers.TrainerCallback):
        """The scheduler's LR as each step begins: what the Trainer hands the optimizer."""

        def on_step_begin(self, args, state, control, lr_scheduler=None, **kwargs):
            lrs.append(lr_scheduler.get_last_lr()[0])

    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=_Rows(STEPS * BATCH),
        callbacks=[callback, SchedulerLr()],
    )
    trainer.train()
    guard = callback.guard
    return ClientRun("llama", guard.run_path, guard.summary(), lrs)


# ---------------------------------------------------------------------- Lightning


def lightning_fit(folder: Path) -> ClientRun:
    import lightning.pytorch as L

    from collapse_guard.integrations.lightning import GuardCallback

    class TinyLM(L.LightningModule):
        """Token and position embeddings, two ``nn.MultiheadAttention`` blocks, a head."""

        def __init__(self, d: int = 32) -> None:
            super().__init__()
            self.embed, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(SEQ, d)
            layer = nn.TransformerEncoderLayer(
                d, nhead=2, dim_feedforward=4 * d, dropout=0.0, batch_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
            self.head = nn.Linear(d, VOCAB)
            self.lrs: list[float] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mask = nn.Transformer.generate_square_subsequent_mask(x.size(1))
            h = self.embed(x) + self.pos(torch.arange(x.size(1)))
            return self.head(self.blocks(h, mask=mask, is_causal=True))

        def training_step(self, batch, batch_idx):
            (tokens,) = batch
            self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
            logits = self(tokens[:, :-1])  # through forward: the probe captures its input
            return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3)
            warmup = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda s: min(1.0, (s + 1) / WARMUP)
            )
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": warmup, "interval": "step"},
            }

    torch.manual_seed(0)
    module = TinyLM()
    generator = torch.Generator().manual_seed(2)
    text = _tokens()
    rows = torch.cat([_batch(text, generator) for _ in range(STEPS)])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(rows), batch_size=BATCH)
    callback = GuardCallback(folder, run_id="client-2-lightning")  # fixed: as nanogpt_loop's
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        gradient_clip_val=1.0,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(folder / "trainer"),
    )
    trainer.fit(module, loader)
    guard = callback.guard
    return ClientRun("lightning", guard.run_path, guard.summary(), module.lrs)
