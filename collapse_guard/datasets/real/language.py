"""A procedural language: topic-conditioned Markov text over its own vocabulary, no download.

Text is a sequence of documents. A document starts with one of ``TOPICS`` topic
tokens (ids ``0 .. TOPICS-1``, nowhere else), and every later token is drawn from the
``SUCCESSORS`` tokens that the pair (topic, previous token) allows, with Zipf weights
over them. So a model lowers its loss in two ways: bigram statistics (a local
lookup), and the topic, which it must fetch from the document's first token with
attention, up to a document's length back. That keeps the attention busy, as on real
text, over a vocabulary of 64-512 ids instead of the 256 bytes.

Deterministic: ``load_language(vocab_size, seed)`` draws the grammar and the text from
``numpy.random.default_rng([LANGUAGE_TAG, vocab_size, seed])``: the same ids on every
machine, in every worker.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = [
    "DOC_MEAN_TOKENS",
    "LANGUAGE_TAG",
    "LANGUAGE_TOKENS",
    "SUCCESSORS",
    "TOPICS",
    "ZIPF_EXPONENT",
    "load_language",
]

LANGUAGE_TAG = 0x1A96  # separates this generator's seeds from every other use of (vocab, seed)
TOPICS = 8  # topic tokens; each conditions every transition of its documents
SUCCESSORS = 6  # allowed next tokens per (topic, token): at most 1.54 nats of entropy a token
# (Zipf 1.1 over 6 ranks; less where two ranks drew the same token), far below ln(vocab)
ZIPF_EXPONENT = 1.1
DOC_MEAN_TOKENS = 48  # geometric document lengths: many documents start inside a 64-token
# window, so the topic is often in view and sometimes not
LANGUAGE_TOKENS = 1_000_000  # 2.2-2.9 s to generate (measured, 2 cores at load 7), once
# per worker and vocabulary (cached); a 1,000-step run of 16x64 sees 1M tokens at random
# offsets of a stochastic process: a model of ~100k parameters cannot memorise it


@lru_cache(maxsize=4)
def load_language(vocab_size: int, seed: int = 0, tokens: int = LANGUAGE_TOKENS) -> np.ndarray:
    """``tokens`` ids of the language with ``vocab_size`` ids, as a read-only int16 array."""
    if not 2 * TOPICS <= vocab_size <= 32_767:
        raise ValueError(
            f"vocab_size must be in [{2 * TOPICS}, 32767] (topics plus words, int16 ids), "
            f"got {vocab_size}; pass e.g. 128"
        )
    rng = np.random.default_rng([LANGUAGE_TAG, vocab_size, seed])
    # successors[topic][token] = the words that may follow ``token`` in ``topic``'s documents
    successors = rng.integers(TOPICS, vocab_size, size=(TOPICS, vocab_size, SUCCESSORS)).tolist()
    weights = 1.0 / np.arange(1, SUCCESSORS + 1) ** ZIPF_EXPONENT
    ranks = np.searchsorted(np.cumsum(weights / weights.sum()), rng.random(tokens))
    ranks = np.minimum(ranks, SUCCESSORS - 1).tolist()  # guards the last bin's rounding
    lengths = rng.geometric(1.0 / DOC_MEAN_TOKENS, size=tokens // 2 + 1).tolist()
    topics = rng.integers(0, TOPICS, size=len(lengths)).tolist()
    out = [0] * tokens
    position, document = 0, 0
    while position < tokens:
        topic = topics[document]
        table = successors[topic]
        out[position] = previous = topic
        end = min(tokens, position + 1 + lengths[document])
        for i in range(position + 1, end):
            out[i] = previous = table[previous][ranks[i]]
        position, document = end, document + 1
    text = np.asarray(out, dtype=np.int16)
    text.flags.writeable = False  # shared by every run of a worker through the cache
    return text
