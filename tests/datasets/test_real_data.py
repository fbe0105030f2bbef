"""Real runs: the procedural language and the batches of both data kinds."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from collapse_guard.datasets.real import RealRunConfig
from collapse_guard.datasets.real.data import BatchSource
from collapse_guard.datasets.real.language import SUCCESSORS, TOPICS, load_language


def test_language_is_deterministic_and_uses_its_vocabulary():
    first = load_language(64, tokens=50_000)
    load_language.cache_clear()
    again = load_language(64, tokens=50_000)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, load_language(64, seed=1, tokens=50_000))
    assert first.min() == 0 and first.max() == 63
    assert len(np.unique(first)) == 64  # every id of the vocabulary occurs
    big = load_language(512, tokens=50_000)
    assert big.max() == 511 and len(np.unique(big)) > 400


def test_language_follows_its_grammar():
    text = load_language(128, tokens=50_000).astype(np.int64)
    # topic tokens open documents: never two in a row, and a word follows each
    topics = text < TOPICS
    assert not (topics[:-1] & topics[1:]).any()
    # within a document, each (topic, previous token) allows at most SUCCESSORS next tokens
    follows: dict[tuple[int, int], set[int]] = {}
    topic = None
    for previous, token in itertools.pairwise(text):
        if previous < TOPICS:
            topic = int(previous)
        if token < TOPICS or topic is None:
            continue
        follows.setdefault((topic, int(previous)), set()).add(int(token))
    assert max(len(s) for s in follows.values()) <= SUCCESSORS
    # and the topic matters: the same previous token is followed differently in two topics
    word = int(text[10])
    assert follows.get((0, word)) != follows.get((1, word))


def test_language_refuses_a_vocabulary_too_small_for_its_topics():
    with pytest.raises(ValueError, match="vocab_size must be in"):
        load_language(10)


@pytest.mark.parametrize(("data", "vocab"), [("bytes", 256), ("language", 128)])
def test_batches_are_next_token_pairs_within_the_vocabulary(data, vocab):
    config = RealRunConfig(data=data, vocab_size=vocab, batch_size=4, seq_len=16)
    x, y = BatchSource(config, torch.Generator().manual_seed(0)).next()
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) < vocab and int(x.min()) >= 0
    again, _ = BatchSource(config, torch.Generator().manual_seed(0)).next()
    assert torch.equal(x, again)


def test_config_refuses_bytes_with_another_vocabulary():
    with pytest.raises(ValueError, match="byte-level data has vocab_size 256"):
        RealRunConfig(data="bytes", vocab_size=128)
