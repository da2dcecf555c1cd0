"""Greedy decoding: the loop shared by the trainer's samples and lm-eval's ``generate_until``.

The caller supplies ``next_ids`` (row indices and their token ids → the argmax next token
of each row), so the same loop serves a fixed loop count and adaptive exit, one prompt or a
batch. :class:`CachedNextIds` is that function with a KV cache (:mod:`.kv_cache`; adaptive
exit per token: :mod:`.kv_adaptive`): it prefills the rows once and then feeds one token per
row and step; :class:`WindowNextIds` recomputes every row's whole window each step (the reference).
:func:`greedy_generate` puts them together.

The cache is exact against the window (tests): whenever a row's window slides (it reached
``context_len``, so its positions restart), the rows are prefilled again, as the window
would compute them; past ``context_len`` a cached step therefore costs what an uncached one
does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .kv_adaptive import ExitRule, kv_adaptive_prefill, kv_adaptive_step

STOP_EOS, STOP_LENGTH, STOP_STRING = "eos", "length", "stop"
RESERVE_MAX = 64  # cache columns reserved past the prompt at most; beyond, it doubles


def greedy_decode(next_ids: Callable[[list[int], list[list[int]]], Sequence[int]],
                  prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int], *,
                  eos_id: int | None, context_len: int,
                  stopped: Callable[[int, list[int]], bool] | None = None,
                  ) -> list[tuple[list[int], str]]:
    """Greedy continuations of ``prompts``, decoded together; each row stops on its own.

    Each step calls ``next_ids(indices, rows)`` on the still-active rows (their indices into
    ``prompts``, and each row cut to its last ``context_len`` tokens). Row ``i`` ends at ``eos_id`` (not kept: reason ``"eos"``), when
    ``stopped(i, new_ids)`` says so after a token is kept (``"stop"``), or after
    ``max_new_tokens[i]`` new tokens (``"length"``). Returns ``(new ids, reason)`` per row.
    """
    generated: list[list[int]] = [[] for _ in prompts]
    reasons = [STOP_LENGTH] * len(prompts)
    active = [i for i, budget in enumerate(max_new_tokens) if budget > 0]
    while active:
        rows = [(list(prompts[i]) + generated[i])[-context_len:] for i in active]
        still = []
        for i, token in zip(active, next_ids(active, rows), strict=True):
            if eos_id is not None and token == eos_id:
                reasons[i] = STOP_EOS
                continue
            generated[i].append(token)
            if stopped is not None and stopped(i, generated[i]):
                reasons[i] = STOP_STRING
            elif len(generated[i]) < max_new_tokens[i]:
                still.append(i)
        active = still
    return list(zip(generated, reasons, strict=True))


def padded_rows(rows: Sequence[Sequence[int]], pad_id: int, device: Any
                ) -> tuple[Tensor, Tensor]:
    """Right-padded ids [B, L] and real lengths [B] of ``rows`` (the model is causal, so
    padding after a row's last token never changes what it sees)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    return ids.to(device), lengths.to(device)


class WindowNextIds:
    """``next_ids`` that recomputes each row's whole window every step (no cache)."""

    def __init__(self, model: Any, h_eff: int, *, pad_id: int = 0, device: Any = None) -> None:
        self.model, self.h_eff, self.pad_id = model, int(h_eff), pad_id
        self.device = model.head_weight.device if device is None else device

    def logits(self, active: list[int], rows: list[list[int]]) -> Tensor:
        """Next-token logits [len(rows), V] of each row (on the model's device)."""
        ids, lengths = padded_rows(rows, self.pad_id, self.device)
        logits = self.model.logits_at(ids, self.h_eff)  # [B, L, V]
        return logits[torch.arange(len(rows), device=logits.device), lengths - 1]

    def __call__(self, active: list[int], rows: list[list[int]]) -> list[int]:
        return self.logits(active, rows).argmax(dim=-1).tolist()


class CachedNextIds(WindowNextIds):
    """``next_ids`` over a KV cache kept across the steps of one :func:`greedy_decode`.

    A step whose rows are the cached rows plus one token each (rows that stopped are
    dropped from the cache) is one ``decode_step``; any other call (the first, or a window
    that slid) prefills. ``prefills``/``steps`` count both kinds of pass.

    ``exit_rule``: adaptive exit (:mod:`.kv_adaptive`), at most ``exit_rule.max_loops``
    loops (``h_eff`` is ignored); ``options``: the cache's ``kv_share``, ``kv_fill`` and
    ``continuous`` (:mod:`.kv_cache`). After each call ``loops`` holds the loops each row's
    token computed, ``kv_bytes`` the largest cache so far and ``kv_bytes_core`` the largest
    core-block part of it (:attr:`.kv_cache.KVCache.nbytes_core`).
    """

    def __init__(self, model: Any, h_eff: int, *, pad_id: int = 0, device: Any = None,
                 reserve: int = 0, exit_rule: ExitRule | None = None, **options: Any) -> None:
        super().__init__(model, exit_rule.max_loops if exit_rule else h_eff, pad_id=pad_id,
                         device=device)
        self.reserve = min(reserve, RESERVE_MAX)  # rows often stop early; the cache grows
        self.exit_rule, self.options = exit_rule, options
        self.loops: list[int] = []
        self.kv_bytes = self.kv_bytes_core = 0
        self.cache: Any = None
        self.held: dict[int, list[int]] = {}  # prompt index → the tokens its cache row holds
        self.order: list[int] = []  # prompt index of each cache row
        self.prefills = self.steps = 0

    def _extends(self, active: list[int], rows: list[list[int]]) -> bool:
        return self.cache is not None and all(
            i in self.held and len(row) == len(self.held[i]) + 1 and row[:-1] == self.held[i]
            for i, row in zip(active, rows, strict=True))

    def logits(self, active: list[int], rows: list[list[int]]) -> Tensor:
        if self._extends(active, rows):
            if active != self.order:
                where = {i: r for r, i in enumerate(self.order)}
                self.cache.select(torch.tensor([where[i] for i in active]))
            tokens = torch.tensor([row[-1] for row in rows], device=self.device)
            if self.exit_rule is None:
                out, loops = self.model.decode_step(self.cache, tokens), None
            else:
                out, loops = kv_adaptive_step(self.model, self.cache, tokens, self.exit_rule)
            self.steps += 1
        else:
            ids, lengths = padded_rows(rows, self.pad_id, self.device)
            if self.exit_rule is None:
                out, self.cache = self.model.prefill(ids, self.h_eff, lengths, self.reserve,
                                                     **self.options)
                loops = None
            else:
                out, loops, self.cache = kv_adaptive_prefill(
                    self.model, ids, self.exit_rule, lengths, self.reserve, **self.options)
            self.prefills += 1
        self.loops = [self.h_eff] * len(rows) if loops is None else loops.tolist()
        self.kv_bytes = max(self.kv_bytes, self.cache.nbytes)
        self.kv_bytes_core = max(self.kv_bytes_core, self.cache.nbytes_core)
        self.order = list(active)
        self.held = {i: list(row) for i, row in zip(active, rows, strict=True)}
        return out


@torch.no_grad()
def greedy_generate(model: Any, prompts: Sequence[Sequence[int]],
                    max_new_tokens: int | Sequence[int], *, h_eff: int, eos_id: int | None,
                    context_len: int, use_cache: bool = True,
                    stopped: Callable[[int, list[int]], bool] | None = None,
                    device: Any = None, **options: Any) -> list[tuple[list[int], str]]:
    """Greedy continuations of ``prompts`` read out after ``h_eff`` loops (see
    :func:`greedy_decode`), with the KV cache unless ``use_cache=False``; rows are padded
    with ``eos_id`` (0 without one). Put the model in eval mode first. ``options``: those
    of :class:`CachedNextIds` (``exit_rule``, ``kv_share``, ``kv_fill``, ``continuous``)."""
    if options and not use_cache:
        raise ValueError(f"{sorted(options)} need the KV cache (use_cache=True)")
    budgets = ([int(max_new_tokens)] * len(prompts) if isinstance(max_new_tokens, int)
               else [int(n) for n in max_new_tokens])
    pad = 0 if eos_id is None else eos_id
    next_ids = (CachedNextIds(model, h_eff, pad_id=pad, device=device,
                              reserve=max(budgets, default=0), **options) if use_cache
                else WindowNextIds(model, h_eff, pad_id=pad, device=device))
    return greedy_decode(next_ids, prompts, budgets, eos_id=eos_id, context_len=context_len,
                         stopped=stopped)
