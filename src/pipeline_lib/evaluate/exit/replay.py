"""What a cached decoder spends: cached adaptive decoding (:mod:`pipeline_lib.model.
kv_adaptive`) replayed, teacher-forced, over the H_eff sweep's rows.

The sweep's adaptive exits (:mod:`.runs`) measure the loops each token *needs*: one parallel
pass in which every position computes every loop, so a later token attends to every loop of
an earlier one. A cached decoder stops computing a token at its exit; a later token reads, at
the loops past it, that token's last computed keys and values (``kv_fill`` ``latest``) or
nothing (``skip``). Its states, and so its exits and its predictions, differ. The replay
decodes every document piece of a batch with :func:`~pipeline_lib.model.kv_adaptive.
kv_adaptive_prefill` and :func:`~pipeline_lib.model.kv_adaptive.kv_adaptive_step`, fed the
true next token:

- the prompt is the piece up to its first scored position (an ``answer_*`` objective's
  question, else the piece's first token), prefilled at full depth; the prompt's last token
  is read out at its exit, as ``generate`` reads the first new token. The prefill computes
  the prompt as the sweep's pass does (the same loops over the same tokens, equal up to
  float rounding), and its keys and values do not depend on the exit rule, so each piece
  is prefilled once (:func:`~pipeline_lib.model.kv_cache.kv_prefill`) and the prompt's
  last token keeps the sweep's exit and loss;
- every later token up to the piece's last scored one is one decoding step, for all pieces
  and all thresholds at once (one cache row per piece and threshold:
  :meth:`~.cached.CriterionExit.per_row`); each scored token gets the loops it computed and
  the cross-entropy of its prediction at its exit.

Without coda blocks the decoding steps run loop by loop instead, every position at once
(:mod:`.replay_loops`: the same numbers, far fewer operations when many tokens decode).

A threshold under which no token exits early is not replayed: the decoder then computes
every loop of every token, fixed-depth cached decoding (the exact edge of
:mod:`~pipeline_lib.model.kv_adaptive`), so it takes the fixed losses and max loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...model.kv_adaptive import kv_adaptive_step
from ...spec.names import IGNORE_INDEX
from .cached import CriterionExit
from .criteria import never_exits
from .replay_loops import decode_loops
from .spec import ExitSpec


@dataclass
class Replayed:
    """Per scored token (row-major order of the targets not ignored) of one batch, in the
    format of :meth:`~.runs.CriterionExits.result`."""

    losses: Tensor  # [n, K+1] fp32: column 0 the fixed loss at max loops, 1+k threshold k
    loops: Tensor  # [n, K] int64 loops computed under threshold k
    kv_bytes_per_token: int | None  # the decoder's cache per token (None: nothing replayed)


@dataclass
class _Pieces:
    """The document pieces of a batch that hold a scored target (flat positions row·L+col)."""

    start: Tensor  # [S] the piece's first token
    first: Tensor  # [S] its first scored position: the prompt's last token
    steps: Tensor  # [S] decoding steps: its last scored position − first
    decoded: Tensor  # [B·L] bool: the positions after their piece's first, up to its last


def _pieces(batch: Any) -> _Pieces:
    targets = batch["targets"]
    B, L = targets.shape
    new = torch.ones(B, L, dtype=torch.bool, device=targets.device)  # a piece starts here
    doc = batch.get("doc_ids")
    if doc is not None:
        new[:, 1:] = doc[:, 1:] != doc[:, :-1]
    piece = new.reshape(-1).cumsum(0) - 1  # [B·L] piece of every position
    flat = torch.arange(B * L, device=targets.device)
    S = int(piece[-1]) + 1
    scored = targets.reshape(-1) != IGNORE_INDEX
    start = flat.new_full((S,), B * L).scatter_reduce(0, piece, flat, "amin")
    first = flat.new_full((S,), B * L).scatter_reduce(0, piece[scored], flat[scored], "amin")
    last = flat.new_full((S,), -1).scatter_reduce(0, piece[scored], flat[scored], "amax")
    keep = last >= 0
    decoded = (flat > first[piece]) & (flat <= last[piece])
    return _Pieces(start[keep], first[keep], (last - first)[keep], decoded)


@torch.no_grad()
def replay_batch(model: Any, batch: Any, spec: ExitSpec, kv_fill: str,
                 needs: tuple[Tensor, Tensor]) -> Replayed:
    """The scored tokens of ``batch`` decoded by the cached decoder under every threshold of
    the resolved ``spec`` and ``kv_fill`` (module doc). ``needs``: the sweep's exits of
    ``spec`` (:meth:`~.runs.CriterionExits.result`: losses [n, K+1], exit loops [n, K]),
    which are the prompts' last tokens' too (the prefill computes them as the sweep does)."""
    needed_losses, needed_loops = needs
    losses = needed_losses.float().T.clone()  # [K+1, n]; a never-exit threshold keeps these
    loops = needed_loops.T.clone()  # [K, n]
    replayed = [k for k, x in enumerate(spec.thresholds) if not never_exits(spec.criterion, x)]
    per_token = None
    if spec.max_loops > 1 and replayed and loops.numel():
        per_token = _decode(model, batch, spec, kv_fill, replayed, losses[1:], loops)
    return Replayed(losses.T, loops.T, per_token)


def _decode(model: Any, batch: Any, spec: ExitSpec, kv_fill: str, replayed: list[int],
            losses: Tensor, loops: Tensor) -> int | None:
    """Prefill every piece that decodes a token once, then decode each (piece, threshold k in
    ``replayed``) as one cache row, the rows with the most steps first (a row leaves the
    cache when its piece is done); write each decoded scored token's loss and loops into
    ``losses``/``loops`` [K, n]; the cache's bytes per token (None: nothing to decode)."""
    targets = batch["targets"].reshape(-1)
    B, L = batch["targets"].shape
    dev = targets.device
    slot = torch.full_like(targets, -1)  # flat position → index among the scored tokens
    slot[targets != IGNORE_INDEX] = torch.arange(losses.shape[1], device=dev)
    pieces = _pieces(batch)
    if not bool(pieces.decoded.any()):
        return None
    if model.cfg.coda_layers == 0:  # the same, loop by loop (replay_loops)
        return decode_loops(model, batch, spec, kv_fill, replayed, pieces.decoded, slot,
                            losses, loops)
    order = torch.argsort(pieces.steps, descending=True, stable=True)
    order = order[pieces.steps[order] > 0]  # pieces that decode, most steps first
    start, first, steps = pieces.start[order], pieces.first[order], pieces.steps[order]
    ids = batch["input_ids"].reshape(-1)
    pos = batch.get("position_ids")
    pos = (torch.arange(L, device=dev).expand(B, L) if pos is None else pos).reshape(-1)
    lengths = first - start + 1
    cols = torch.minimum(start[:, None] + torch.arange(int(lengths.max()), device=dev),
                         first[:, None])  # [S, prompt]: right-padded with the last token
    # the prompt's keys and values do not depend on the exit rule (full depth): one prefill
    _, cache = model.prefill({"input_ids": ids[cols], "position_ids": pos[cols]},
                             spec.max_loops, lengths, int(steps.max()), kv_fill=kv_fill)
    per_token = cache.nbytes // (cache.rows * cache.capacity)
    S = len(order)  # cache row → piece (rows of the prefill) and threshold, most steps first
    piece = torch.arange(S, device=dev).repeat_interleave(len(replayed))
    k_of = torch.tensor(replayed, device=dev).repeat(S)
    cache.select(piece)
    first, steps = first[piece], steps[piece]
    rule = CriterionExit(model, ExitSpec((spec.thresholds[replayed[0]],), spec.criterion,
                                         spec.max_loops), f"eval.adaptive ({spec.criterion})")
    rule.per_row([spec.thresholds[k] for k in k_of.tolist()])
    for i in range(1, int(steps.max()) + 1):
        live = int((steps >= i).sum())  # rows are sorted by steps: a prefix goes on
        if live < cache.rows:
            keep = torch.arange(live, device=dev)
            cache.select(keep)
            rule.select(keep)
        at = first[:live] + i
        logits, used = kv_adaptive_step(model, cache, ids[at], rule)
        index = slot[at]
        ok = index >= 0
        ce = F.cross_entropy(logits[ok].float(), targets[at[ok]], reduction="none")
        losses[k_of[:live][ok], index[ok]] = ce
        loops[k_of[:live][ok], index[ok]] = used[ok]
    return per_token
