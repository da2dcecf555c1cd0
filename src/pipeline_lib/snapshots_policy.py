"""Snapshot policy: how many steps, where segments end, which segment snapshots are kept.

Everything here is known before training starts and is computed from the config alone, so
the Snakefile can declare the kept snapshots as outputs and the others as ``temp()`` ones
(deleted once the next segment consumed them). Torch-free: Snakemake imports this on every
call, dry runs included.

``snapshots.keep_best`` cannot be decided in advance; training jobs maintain
``snapshots/best`` themselves (:func:`pipeline_lib.checkpoint.best.update_best_snapshot`).
"""

from __future__ import annotations

import dataclasses
import math

from .config import ModelConfig, SnapshotsConfig, TrainConfig
from .errors import ConfigError
from .run_layout import step_dir_name as step_dir_name  # where a step's snapshot lives


def total_steps(train: TrainConfig, model: ModelConfig, seq_len: int, vocab_size: int) -> int:
    """Optimizer steps of the run: ``train.total_steps``, or from the token budget when it is 0.

    Token budget: ``tokens = param_count × train.token_budget_multiplier`` and
    ``steps = ceil(tokens / (seq_len × train.global_batch_rows))`` (at least 1).
    ``vocab_size`` (the tokenizer's) is used when ``model.vocab_size`` is 0.
    """
    if train.total_steps > 0:
        return train.total_steps
    from .model.size import param_count  # torch-free arithmetic on the config

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


def segment_ends(total_steps: int, steps_per_segment: int) -> list[int]:
    """Steps at which segments end: every ``steps_per_segment`` and ``total_steps`` itself.

    Segment k trains steps ``[ends[k-1], ends[k])`` (from 0 for k = 0) and writes the
    snapshot ``step_{ends[k]}``; the last segment may be shorter.
    """
    if total_steps < 1:
        raise ConfigError(f"train.total_steps = {total_steps}: a run needs at least one step")
    if steps_per_segment < 1:
        raise ConfigError(f"train.steps_per_segment = {steps_per_segment} must be at least 1")
    ends = list(range(steps_per_segment, total_steps, steps_per_segment))
    return [*ends, total_steps]


def kept_steps(ends: list[int], snap: SnapshotsConfig) -> list[int]:
    """Segment ends whose snapshots are kept: the last ``keep_last``, every multiple of
    ``keep_every`` (when > 0), and always the final one. Sorted."""
    if not ends:
        return []
    kept = set(ends[-snap.keep_last:]) if snap.keep_last > 0 else set()
    if snap.keep_every > 0:
        kept.update(s for s in ends if s % snap.keep_every == 0)
    kept.add(ends[-1])
    return sorted(kept)


def previous_end(ends: list[int], step: int) -> int | None:
    """The snapshot step the segment ending at ``step`` resumes from (None for the first)."""
    if step not in ends:
        raise ConfigError(f"step {step} is not a segment end ({ends[:3]}…{ends[-1:]}); snapshots "
                          "exist only at multiples of train.steps_per_segment and total_steps")
    i = ends.index(step)
    return ends[i - 1] if i else None
