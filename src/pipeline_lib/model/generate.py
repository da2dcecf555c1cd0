"""Greedy decoding: the loop shared by the trainer's samples and lm-eval's ``generate_until``.

The caller supplies ``next_ids`` (row indices and their token ids → the argmax next token
of each row), so the same loop serves a fixed loop count and adaptive exit, one prompt or a
batch. Each step recomputes every row's whole window (no KV cache): prompts and budgets are
small.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

STOP_EOS, STOP_LENGTH, STOP_STRING = "eos", "length", "stop"


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
