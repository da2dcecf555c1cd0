"""How lm-eval requests become model inputs: scoring windows and generation settings.

No model here: these are the pure rules :class:`~pipeline_lib.bench.lm_wrapper.LooplineLM`
follows, testable on token lists and strings alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
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


def generation_settings(gen_kwargs: dict[str, Any], default_max_gen: int
                        ) -> tuple[list[str], int, bool]:
    """Stop strings (``until``, empty ones dropped), the token budget (``max_gen_toks``, else
    ``default_max_gen``) and whether sampling was asked for (loopline decodes greedily)."""
    until = gen_kwargs.get("until") or []
    if isinstance(until, str):
        until = [until]
    if not isinstance(until, list) or not all(isinstance(s, str) for s in until):
        raise ConfigError(f"generation_kwargs until={until!r} must be a string or a list of "
                          "strings")
    sampling = bool(gen_kwargs.get("do_sample")
                    or float(gen_kwargs.get("temperature") or 0.0) > 0)
    max_gen = as_int("max_gen_toks", gen_kwargs.get("max_gen_toks", default_max_gen), 0)
    return [s for s in until if s], max_gen, sampling


def cut_at_stops(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` up to the earliest stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
