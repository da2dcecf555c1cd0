"""Tiny configs and packed batches built here (the model tests need no data stage)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from pipeline_lib.spec.config_model import ModelConfig

VOCAB = 48


def tiny_config(**overrides) -> ModelConfig:
    """A model small enough for a one-core test: d_model 16, 2 heads, vocab 48."""
    base = dict(vocab_size=VOCAB, d_model=16, n_heads=2, prelude_layers=1, core_layers=1,
                coda_layers=1, loops=3, loss_chunk_size=7)
    base.update(overrides)
    return ModelConfig(**base)


def packed_batch(rows: Sequence[Sequence[int]], seed: int = 0, vocab: int = VOCAB,
                 pad_to: int | None = None, answer_every: int = 0) -> dict[str, torch.Tensor]:
    """A loader-style batch: each row packs documents of the given lengths.

    Within a document, targets are the next token; the last token of each document and any
    padding have target -100. ``position_ids`` restart at 0 per document, ``doc_ids`` count
    documents within the row (padding gets its own id). ``answer_every`` > 0 marks every
    n-th token as an answer token.
    """
    gen = torch.Generator().manual_seed(seed)
    L = pad_to or max(sum(r) for r in rows)
    out = {k: torch.full((len(rows), L), v, dtype=torch.long)
           for k, v in (("input_ids", 0), ("targets", -100), ("position_ids", 0), ("doc_ids", 0))}
    for b, lengths in enumerate(rows):
        pos = 0
        for d, n in enumerate(lengths):
            tokens = torch.randint(1, vocab, (n + 1,), generator=gen)
            out["input_ids"][b, pos:pos + n] = tokens[:n]
            out["targets"][b, pos:pos + n - 1] = tokens[1:n]
            out["position_ids"][b, pos:pos + n] = torch.arange(n)
            out["doc_ids"][b, pos:pos + n] = d
            pos += n
        out["doc_ids"][b, pos:] = len(lengths)
        out["position_ids"][b, pos:] = torch.arange(L - pos)
    if answer_every:
        out["answer_mask"] = (torch.arange(L) % answer_every == 0).expand(len(rows), L).clone()
    return out


@pytest.fixture
def make_config() -> Callable[..., ModelConfig]:
    return tiny_config


@pytest.fixture
def make_batch() -> Callable[..., dict[str, torch.Tensor]]:
    return packed_batch
