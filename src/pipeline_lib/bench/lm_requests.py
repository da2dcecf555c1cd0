"""How lm-eval requests become model inputs: scoring windows, generation settings and the
seed of each sampled answer.

No model here: these are the pure rules :class:`~pipeline_lib.bench.lm_wrapper.LooplineLM`
follows, testable on token lists and strings alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..evaluate.generation import Sampling
from ..task_yaml import generation_draw
from .model_args import as_int

# (input ids [≤ seq_len], targets: the last len(targets) positions predict them)
Window = tuple[list[int], list[int]]


def score_windows(context: Sequence[int], continuation: Sequence[int], seq_len: int) -> list[Window]:
    """Windows of at most ``seq_len`` inputs that together score every continuation token once.

    Targets are cut into consecutive chunks of ``seq_len`` tokens; each chunk is predicted
    from the (up to) ``seq_len`` tokens ending just before its last token, so the last chunk,
    and the only one in the usual short-continuation case, gets as much left context as fits.
    """
    assert context, "the context needs at least one token (EOS for an empty context)"
    tokens = list(context) + list(continuation)
    first = len(context)
    windows: list[Window] = []
    for a in range(first, len(tokens), seq_len):
        b = min(a + seq_len, len(tokens))
        start = max(0, b - 1 - seq_len)
        windows.append((tokens[start:b - 1], tokens[a:b]))
    return windows


@dataclass(frozen=True)
class GenSettings:
    """How one ``generate_until`` request decodes: stop strings, token budget and
    ``sampling`` (None: greedy, the argmax at every step)."""

    stops: list[str]
    max_gen: int
    sampling: Sampling | None = None


def sampling_settings(gen_kwargs: dict[str, Any], task: str = "unknown") -> Sampling | None:
    """The draw ``gen_kwargs`` ask for (:func:`pipeline_lib.task_yaml.generation_draw`, the
    rules and their one-line errors), as :func:`~pipeline_lib.evaluate.generation.pick_tokens`
    takes it; None: greedy."""
    draw = generation_draw(gen_kwargs, task)
    if draw is None:
        return None
    temperature, top_p, top_k = draw
    return Sampling(temperature, top_p, 0, top_k)


def generation_settings(gen_kwargs: dict[str, Any], default_max_gen: int,
                        task: str = "unknown") -> GenSettings:
    """Stop strings (``until``, empty ones dropped), the token budget (``max_gen_toks``, else
    ``default_max_gen``) and the draw (:func:`sampling_settings`) of one request of ``task``."""
    until = gen_kwargs.get("until") or []
    if isinstance(until, str):
        until = [until]
    if not isinstance(until, list) or not all(isinstance(s, str) for s in until):
        raise ConfigError(f"task {task}: generation_kwargs until={until!r} must be a string or "
                          "a list of strings; fix it in the task's YAML")
    max_gen = as_int("max_gen_toks", gen_kwargs.get("max_gen_toks", default_max_gen), 0)
    return GenSettings([s for s in until if s], max_gen, sampling_settings(gen_kwargs, task))


def request_seed(seed: int, task: str | None, doc_id: int | None, idx: int, repeat: int,
                 h_eff: str, context: str) -> int:
    """The seed of one sampled answer: (seed, task, doc_id, request index, repeat, H_eff)
    hashed, so a request draws the same tokens whatever else is in the run, in whichever
    order or batch; a request without a doc_id (outside lm-eval's evaluator) is told apart
    by its context instead."""
    where = [task, doc_id, idx] if doc_id is not None else [task, context]
    text = json.dumps([int(seed), *where, int(repeat), str(h_eff)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def repeat_indices(keys: Sequence[Any]) -> list[int]:
    """How many times each key occurred before it: lm-eval hands a task's ``repeats`` copies
    of a request over one after another, and the n-th copy is repeat n."""
    seen: dict[Any, int] = {}
    out = []
    for key in keys:
        out.append(seen.get(key, 0))
        seen[key] = out[-1] + 1
    return out


def cut_at_stops(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` up to the earliest stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
