"""The cached decoder's replay loop by loop (:mod:`.replay`), for models without coda blocks.

Decoding token after token computes, at loop t, each token from the earlier tokens' keys and
values of loop t: their own, or for a token that exited at e ≤ t those of loop e (``kv_fill``
``latest``) or none (``skip``). Causality makes that one parallel pass per loop: at loop t
every position runs at once, and a decoded position that exited earlier gives its last
computed keys and values (latest) or is masked as a key (skip); its new state is never read
again. Prompt positions never exit (the prefill computes them at full depth). Equal to
the token-by-token replay up to float rounding (tested).

A coda block breaks this: a decoded token's readout attends to the earlier tokens' coda keys
and values of *their* exit loops, which a loop-by-loop pass has not reached yet; with coda
blocks :mod:`.replay` decodes token by token.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...model.attention import sdpa
from ...model.kv_cache import attention_calls
from .cached import CriterionExit
from .spec import ExitSpec


class FrozenKV:
    """The ``mask`` of a replay loop's attention calls: the document-causal mask [R, 1, L, L]
    (bool), where the positions ``done`` past their exit give their last keys and values
    (``latest``) or are masked as keys (``skip``)."""

    def __init__(self, allowed: Tensor, kv_fill: str) -> None:
        self.allowed, self.kv_fill = allowed, kv_fill
        self.mask = allowed
        self.keys: list[Tensor] = []  # latest: per core block, the last computed [R, KV, L, hd]
        self.values: list[Tensor] = []
        self.done: Tensor | None = None
        self.call = 0
        self.bytes_per_call = 0  # one token's keys and values of one attention call

    def loop(self, done: Tensor) -> None:
        """Before a loop: ``done`` [R, L] bool, the positions that stopped before it."""
        self.done, self.call = done, 0
        if self.kv_fill == "skip":
            eye = torch.eye(done.shape[1], dtype=torch.bool, device=done.device)
            self.mask = self.allowed & (~done[:, None, None, :] | eye)  # a row keeps itself

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention of q [R, H, L, hd] over k, v [R, KV, L, hd] (see the class doc)."""
        j, self.call = self.call, self.call + 1
        self.bytes_per_call = 2 * k.shape[1] * k.shape[3] * k.element_size()
        if self.kv_fill == "latest":
            if j < len(self.keys):
                done = self.done[:, None, :, None]
                k = torch.where(done, self.keys[j], k)
                v = torch.where(done, self.values[j], v)
                self.keys[j], self.values[j] = k, v
            else:
                self.keys.append(k)
                self.values.append(v)
        return sdpa(q, k, v, self.mask)


def decode_loops(model: Any, batch: Any, spec: ExitSpec, kv_fill: str, replayed: list[int],
                 decoded: Tensor, slot: Tensor, losses: Tensor, loops: Tensor) -> int:
    """The replay of thresholds ``replayed`` (one copy of the batch each), loop by loop;
    ``decoded`` [B·L] bool: the positions decoded token by token; ``slot`` [B·L]: each
    position's index among the scored tokens (−1: none). Writes ``losses``/``loops`` [K, n];
    returns the cache's bytes per token."""
    assert model.cfg.coda_layers == 0, "with coda blocks the replay decodes token by token"
    H, R = spec.max_loops, len(replayed)
    targets = batch["targets"].reshape(-1)
    BL = targets.numel()
    ctx = model.embed({k: batch[k].repeat(R, 1) for k in ("input_ids", "position_ids",
                                                          "doc_ids") if k in batch})
    frozen = FrozenKV(ctx.mask.dense, kv_fill)
    ctx.mask = frozen
    state = model.init_state(ctx)  # [R·B, L, D]
    D = state.shape[-1]
    live = decoded.repeat(R).nonzero().squeeze(1)  # flat positions still looping
    exit_at = torch.full((R * BL,), H, dtype=torch.long, device=live.device)
    rule = CriterionExit(model, ExitSpec((spec.thresholds[replayed[0]],), spec.criterion, H),
                         f"eval.adaptive ({spec.criterion})")
    rule.per_row([spec.thresholds[replayed[int(i)]] for i in (live // BL).tolist()])
    rule.start(state.reshape(-1, D)[live],
               lambda: F.linear(model.readout_hidden(state.reshape(-1, D)[live], ctx),
                                model.head_weight))
    for t in range(H):
        frozen.loop((exit_at <= t).view(state.shape[:2]))
        state = model.forward_loops(ctx, t, t + 1, state)
        rows = state.reshape(-1, D)[live]
        hidden = model.readout_hidden(rows, ctx)
        logits = F.linear(hidden, model.head_weight)
        stop = (torch.ones_like(live, dtype=torch.bool) if t == H - 1
                else rule.exited(rows, hidden, logits))
        exit_at[live[stop]] = t + 1
        at, k = live[stop] % BL, torch.tensor(replayed, device=live.device)[live[stop] // BL]
        index = slot[at]
        ok = index >= 0
        losses[k[ok], index[ok]] = F.cross_entropy(logits[stop][ok].float(), targets[at[ok]],
                                                   reduction="none")
        loops[k[ok], index[ok]] = t + 1
        rule.keep(~stop)
        live = live[~stop]
        if not live.numel():
            break
    return attention_calls(model.cfg, H) * frozen.bytes_per_call
