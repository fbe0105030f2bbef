"""The token stream of a run and its batches: byte-level text or the procedural language.

=============  ===========================================================  =======
``data``       what                                                          vocab
=============  ===========================================================  =======
``bytes``      the standard library's Python sources, byte by byte           256
               (``corpus.py``)
``language``   topic-conditioned Markov documents (``language.py``), seeded  64-512
               per vocabulary size
=============  ===========================================================  =======

Batches are ``batch_size`` windows of ``seq_len + 1`` tokens at random offsets, drawn
from the run's own generator: the same run sees the same batches on any machine.
"""

from __future__ import annotations

__all__ = ["BatchSource"]


class BatchSource:
    """Draws ``(x, y)`` batches of the run's data (``config.data``) with ``generator``."""

    def __init__(self, config, generator):
        import torch

        from collapse_guard.datasets.real.corpus import load_corpus
        from collapse_guard.datasets.real.language import load_language

        if config.data == "bytes":
            text = load_corpus()
        else:
            text = load_language(config.vocab_size)
        self.text = torch.from_numpy(text.copy())
        self.offsets = torch.arange(config.seq_len + 1)
        self.batch_size = config.batch_size
        self.seq_len = config.seq_len
        self.generator = generator

    def next(self):
        """The next ``(x, y)``: inputs and their next tokens, ``(batch, seq_len)`` longs."""
        import torch

        starts = torch.randint(
            len(self.text) - self.seq_len - 1, (self.batch_size,), generator=self.generator
        )
        tokens = self.text[starts[:, None] + self.offsets].long()  # (batch, seq_len + 1)
        return tokens[:, :-1], tokens[:, 1:]
