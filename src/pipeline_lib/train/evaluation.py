"""What the trainer measures on fixed inputs: validation loss and greedy samples.

- :func:`validation_losses`: loss after each of several loop counts (``model.loops`` and
  ``train.val_h_eff``) from one pass, on the first ``train.eval_rows`` validation rows (a
  fixed, deterministic slice), token-weighted over its batches; every
  ``train.eval_interval`` steps and at each segment end.
- :func:`generate_samples`: greedy continuations of ``train.sample_prompts``, written with
  every snapshot (``samples.jsonl``); a quick look at what the model writes.

Both run in eval mode without gradients and draw no random numbers (decoding is argmax), so
they never perturb the training state: a segment end that evaluates changes nothing that
the next step computes. Generation uses the KV cache (:mod:`pipeline_lib.model.kv_cache`).
The trainer calls both under its precision (``experiment.precision``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..data.tokenizer import eos_id, load_tokenizer
from ..model.generate import greedy_generate
from ..spec.names import IGNORE_INDEX

log = logging.getLogger(__name__)


@torch.no_grad()
def validation_losses(model: Any, data: Any, num_rows: int, batch_rows: int, *,
                      readouts: Sequence[int], device: torch.device,
                      answer_only: bool = False) -> dict[int, float]:
    """``{h: mean next-token loss (answer weight 1) after h loops}`` for every h in
    ``readouts``, over the first ``num_rows`` validation rows of ``data`` (a PackedData),
    weighted by target tokens; one forward pass per batch reads out every count (exact: loop
    t never depends on the total). ``answer_only`` (``answer_*`` objectives) scores the
    answer tokens alone, as the H_eff sweep does. NaN for every count when no row has a
    target."""
    hs = sorted(set(int(h) for h in readouts))
    was_training = model.training
    model.eval()
    totals = [0.0] * len(hs)
    count = 0
    try:
        for batch in data.eval_batches(num_rows, batch_rows, device, answer_only=answer_only):
            n = int((batch["targets"] != IGNORE_INDEX).sum())
            if n == 0:
                continue
            losses = model.losses(batch, hs)
            for i, value in enumerate(torch.stack([losses[h] for h in hs]).tolist()):
                totals[i] += value * n  # one host sync per batch, whatever the counts
            count += n
    finally:
        model.train(was_training)
    return {h: total / count if count else math.nan for h, total in zip(hs, totals, strict=True)}


@torch.no_grad()
def generate_samples(model: Any, data_dir: Path, prompts: Sequence[str], max_new_tokens: int, *,
                     step: int, loops: int, context_len: int,
                     device: torch.device) -> list[dict[str, Any]]:
    """One record per prompt: ``{"step", "loops", "prompt", "completion", "stop"}``.

    The model is put in eval mode for the duration and returned to its previous mode. Each
    prompt is decoded on its own (a batch of one: rows of unequal length need no padding).
    """
    if not prompts or max_new_tokens <= 0:
        return []
    tok = load_tokenizer(data_dir)
    eos = eos_id(tok)
    was_training = model.training
    model.eval()
    records = []
    try:
        for prompt in prompts:
            prompt_ids = tok.encode(prompt).ids  # with the pack's BOS, if it has one
            if not prompt_ids:
                prompt_ids = [eos]
            [(new, stop)] = greedy_generate(model, [prompt_ids], max_new_tokens, h_eff=loops,
                                            eos_id=eos, context_len=context_len, device=device)
            records.append({"step": step, "loops": loops, "prompt": prompt,
                            "completion": tok.decode(new, skip_special_tokens=True),
                            "completion_ids": new, "stop": stop})
    finally:
        model.train(was_training)
    return records


def samples_jsonl(records: Sequence[dict[str, Any]]) -> str:
    """The records as JSON lines (what the snapshot's ``samples.jsonl`` holds)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
