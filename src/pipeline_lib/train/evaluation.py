"""What the trainer measures on fixed inputs: validation loss and greedy samples.

- :func:`validation_loss`: loss after ``model.loops`` loops on the first
  ``train.eval_rows`` validation rows (a fixed, deterministic slice), token-weighted over
  its batches; every ``train.eval_interval`` steps and at each segment end.
- :func:`generate_samples`: greedy continuations of ``train.sample_prompts``, written with
  every snapshot (``samples.jsonl``); a quick look at what the model writes.

Both run in eval mode without gradients and draw no random numbers (decoding is argmax), so
they never perturb the training state: a segment end that evaluates changes nothing that
the next step computes. Generation recomputes the whole prefix per token (no KV cache):
prompts and budgets are tiny.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..data.loader import IGNORE_INDEX
from ..data.tokenizer import EOS_TOKEN, load_tokenizer

log = logging.getLogger(__name__)


@torch.no_grad()
def greedy_continuation(model: Any, prompt_ids: Sequence[int], max_new_tokens: int, *,
                        loops: int, context_len: int, eos_id: int | None,
                        device: torch.device) -> tuple[list[int], str]:
    """Argmax continuation of ``prompt_ids``: (new ids, stop reason "eos" | "length")."""
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # [1, P]
    new: list[int] = []
    for _ in range(max_new_tokens):
        window = ids[:, -context_len:]  # [1, ≤ context_len]
        logits = model.logits_at(window, loops)[:, -1]  # [1, V]
        nxt = int(logits.argmax(dim=-1))
        if eos_id is not None and nxt == eos_id:
            return new, "eos"
        new.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]], device=device)], dim=1)
    return new, "length"


@torch.no_grad()
def validation_loss(model: Any, data: Any, num_rows: int, batch_rows: int, *, loops: int,
                    device: torch.device) -> float:
    """Mean next-token loss (answer weight 1) after ``loops`` loops over the first
    ``num_rows`` validation rows of ``data`` (a PackedData), weighted by target tokens."""
    was_training = model.training
    model.eval()
    total = 0.0
    count = 0
    try:
        for batch in data.val_batches(num_rows, batch_rows):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            n = int((batch["targets"] != IGNORE_INDEX).sum())
            if n == 0:
                continue
            loss = model.losses(batch, [loops])[loops]
            total += float(loss) * n
            count += n
    finally:
        model.train(was_training)
    return total / count if count else math.nan


def generate_samples(model: Any, data_dir: Path, prompts: Sequence[str], max_new_tokens: int, *,
                     step: int, loops: int, context_len: int,
                     device: torch.device) -> list[dict[str, Any]]:
    """One record per prompt: ``{"step", "loops", "prompt", "completion", "stop"}``.

    The model is put in eval mode for the duration and returned to its previous mode.
    """
    if not prompts or max_new_tokens <= 0:
        return []
    tok = load_tokenizer(data_dir)
    eos = tok.token_to_id(EOS_TOKEN)
    was_training = model.training
    model.eval()
    records = []
    try:
        for prompt in prompts:
            prompt_ids = tok.encode(prompt, add_special_tokens=False).ids
            if not prompt_ids:
                prompt_ids = [eos] if eos is not None else [0]
            new, stop = greedy_continuation(model, prompt_ids, max_new_tokens, loops=loops,
                                            context_len=context_len, eos_id=eos, device=device)
            records.append({"step": step, "loops": loops, "prompt": prompt,
                            "completion": tok.decode(new, skip_special_tokens=True),
                            "completion_ids": new, "stop": stop})
    finally:
        model.train(was_training)
    return records


def samples_jsonl(records: Sequence[dict[str, Any]]) -> str:
    """The records as JSON lines (what the snapshot's ``samples.jsonl`` holds)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
