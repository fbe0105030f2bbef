"""A tiny seeded decoder and its loop, shared by the guard's tests."""

from __future__ import annotations

import torch

from collapse_guard.datasets.real.models.gpt import GPT, GPTConfig

__all__ = ["Loop", "tiny_model"]

VOCAB, SEQ = 32, 16


def tiny_model(seed: int = 0, lr: float = 3e-3) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A 1-layer, 32-wide GPT (about 15k parameters) and its AdamW."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=VOCAB, seq_len=SEQ, n_layer=1, n_head=2, d_model=32))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


class Loop:
    """Seeded batches of a learnable sequence (token t+1 = token t + 1 mod VOCAB, noisy)."""

    def __init__(self, seed: int = 0, batch: int = 8) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.batch = batch

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = torch.randint(0, VOCAB, (self.batch, 1), generator=self.generator)
        tokens = (start + torch.arange(SEQ + 1)) % VOCAB
        noise = torch.rand(tokens.shape, generator=self.generator) < 0.1
        random = torch.randint(0, VOCAB, tokens.shape, generator=self.generator)
        tokens = torch.where(noise, random, tokens)
        return tokens[:, :-1], tokens[:, 1:]

    def loss(self, model: torch.nn.Module) -> torch.Tensor:
        x, y = self.next()
        _, loss = model(x, y)
        loss.backward()
        return loss
