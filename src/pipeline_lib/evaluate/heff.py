"""H_eff sweep: validation loss at several test-time loop counts from ONE pass per batch.

Loop t never depends on the total loop count, so reading out after loops 1, 2, 4, 8 of a
single 8-loop pass gives exactly the losses of four separate evaluations (the prototype's
way) at about the cost of the deepest one. H_eff beyond the training loop count is allowed:
that is the extrapolation the research question asks about.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..errors import ConfigError

log = logging.getLogger(__name__)
IGNORE_INDEX = -100


def parse_h_eff(text: str | Sequence[int]) -> list[int]:
    """``"1,2,4,8"`` (or a list) → sorted distinct loop counts, each ≥ 1."""
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        values = sorted({int(str(v).strip()) for v in items if str(v).strip()})
    except ValueError:
        raise ConfigError(f"--h-eff {text!r} must be comma-separated integers, e.g. 1,2,4,8") \
            from None
    if not values or values[0] < 1:
        raise ConfigError(f"--h-eff {text!r} needs loop counts of at least 1, e.g. 1,2,4,8")
    return values


@torch.no_grad()
def sweep_losses(model: torch.nn.Module, batches: Any, h_effs: Sequence[int],
                 max_tokens: int) -> tuple[dict[int, float], int]:
    """Token-weighted mean loss at every H_eff over ``batches``, up to ``max_tokens`` targets.

    Each batch runs once; its per-H_eff mean is weighted by its number of scored targets, so
    the result equals the loss over all scored tokens at once (up to float rounding).
    """
    model.eval()
    totals = {h: 0.0 for h in h_effs}
    tokens = 0
    bar = tqdm(total=max_tokens, desc="H_eff sweep", unit="tok", leave=False)
    for batch in batches:
        n = int((batch["targets"] != IGNORE_INDEX).sum())
        if n == 0:
            continue
        losses = model.losses(batch, loops=list(h_effs))
        for h in h_effs:
            totals[h] += float(losses[h]) * n
        tokens += n
        bar.update(n)
        if tokens >= max_tokens:
            break
    bar.close()
    if tokens == 0:
        raise ConfigError("the H_eff sweep scored no tokens: the validation split is empty or "
                          "fully padded; raise data.val_fraction and re-pack")
    return {h: totals[h] / tokens for h in h_effs}, tokens


def sweep_result(step: int | None, losses: dict[int, float], tokens: int) -> dict[str, Any]:
    """The JSON document of one snapshot's sweep (see README § Evaluation)."""
    hs = sorted(losses)
    ordered = [losses[h] for h in hs]
    return {
        "step": step,
        "losses": {str(h): losses[h] for h in hs},
        "perplexities": {str(h): math.exp(min(losses[h], 80.0)) for h in hs},
        "tokens": tokens,
        "deeper_better": all(b <= a for a, b in zip(ordered, ordered[1:], strict=False)),
        "best_h_eff": min(hs, key=lambda h: (losses[h], h)),
    }


def run_heff(snapshot: Path, data_dir: Path, h_effs: Sequence[int], out: Path, *,
             max_tokens: int, batch_rows: int, use_ema: bool = False) -> dict[str, Any]:
    """Evaluate ``snapshot`` on the validation split of ``data_dir``; write ``out`` (JSON)."""
    from ..data.loader import PackedData
    from .loading import load_for_eval

    loaded = load_for_eval(snapshot, use_ema=use_ema)
    data = PackedData(data_dir)
    if data.vocab_size > loaded.config.model.vocab_size:
        raise ConfigError(f"data {data_dir} has vocab {data.vocab_size} but snapshot {snapshot} "
                          f"was trained with {loaded.config.model.vocab_size}; pass the run's "
                          "own data directory")
    # Read validation rows until max_tokens targets are scored (or the split ends).
    batches = data.val_batches(data.val_rows, batch_rows)
    losses, tokens = sweep_losses(loaded.model, batches, h_effs, max_tokens)
    if tokens < max_tokens:
        log.info("validation split has only %d scorable tokens (eval.max_tokens = %d)",
                 tokens, max_tokens)
    result = sweep_result(loaded.step, losses, tokens)
    log.info("H_eff sweep of %s: %s (deeper_better=%s)", snapshot,
             {h: round(v, 4) for h, v in losses.items()}, result["deeper_better"])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)
    return result
