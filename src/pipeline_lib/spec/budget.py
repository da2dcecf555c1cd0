"""The run's length in optimizer steps: ``train.total_steps`` or the token budget.

Torch-free: the workflow plan (imported by Snakemake on every call) needs it too.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import ConfigError
from .config_model import ModelConfig
from .config_train import TrainConfig
from .size import param_count


def total_steps(train: TrainConfig, model: ModelConfig, seq_len: int, vocab_size: int) -> int:
    """Optimizer steps of the run: ``train.total_steps``, or from the token budget when it is 0.

    Token budget: ``tokens = param_count × train.token_budget_multiplier`` and
    ``steps = ceil(tokens / (seq_len × train.global_batch_rows))`` (at least 1).
    ``vocab_size`` (the tokenizer's) is used when ``model.vocab_size`` is 0.
    """
    if train.total_steps > 0:
        return train.total_steps

    vocab = model.vocab_size or vocab_size
    if vocab < 1:
        raise ConfigError("model.vocab_size is 0 and no tokenizer vocab size was given; the "
                          "token budget (train.total_steps = 0) needs it: pack the data first "
                          "or set train.total_steps")
    if seq_len < 1:
        raise ConfigError(f"data.seq_len = {seq_len} must be at least 1 for the token budget")
    params = param_count(dataclasses.replace(model, vocab_size=vocab))
    tokens = params * train.token_budget_multiplier
    return max(1, math.ceil(tokens / (seq_len * train.global_batch_rows)))
