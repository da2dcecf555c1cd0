"""Text from a snapshot: greedy or sampled, at a fixed loop count or with adaptive exits.

What ``python -m pipeline_lib generate`` runs. Prompts are decoded in batches through the
shared decoding loop (:func:`pipeline_lib.model.generate.greedy_decode`, called once per
batch in :func:`_decode`, over the KV cache); this module decides how a next token is
chosen:

- depth: the logits after ``h_eff`` core loops, or every token read out at its own adaptive
  exit (the first loop whose criterion score passes the threshold, at most ``max_loops``:
  :class:`~pipeline_lib.evaluate.exit.cached.CriterionExit`), its later loops never computed
  (:mod:`pipeline_lib.model.kv_adaptive`);
- the cache (:class:`CacheOptions`): KV sharing across loops, what a later token reads of a
  position that exited early (``kv_fill``), continuous compute;
- choice: the argmax (greedy, the default), or a draw at ``temperature`` from the smallest
  set of tokens holding ``top_p`` of the probability (nucleus sampling), among the ``top_k``
  most likely when set, from a generator seeded with ``seed``: the same seed, prompts and
  batch size give the same text. lm-eval's ``generate_until`` draws with the same
  :func:`pick_tokens`, one generator per request (:mod:`pipeline_lib.bench.lm_generation`).

A row ends at EOS (not kept) or after ``max_new_tokens``; a prompt longer than the model's
context (``data.seq_len``) is refused, and once a row outgrows the context its oldest tokens
slide out of the window. ``on_text(i, piece)`` receives the text of prompt i as it grows
(whole characters only: bytes of an unfinished UTF-8 character wait for the rest).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..data.tokenizer import eos_id
from ..errors import ConfigError, UsageError
from ..model.generate import CachedNextIds, greedy_decode
from ..model.kv_cache import check_kv_fill, share_every
from ..spec.rules import check_test_loops
from .exit.cached import CriterionExit
from .exit.spec import CRITERIA, ExitSpec


@dataclass(frozen=True)
class Depth:
    """How many loops a token gets: ``loops``, or ``exit``, an adaptive exit (its
    ``max_loops`` filled) at most ``loops`` deep."""

    loops: int
    exit: ExitSpec | None = None  # None: fixed depth

    def __str__(self) -> str:
        if self.exit is None:
            return f"h_eff={self.loops}"
        return f"adaptive:{self.exit.threshold:g}:{self.loops} ({self.exit.criterion})"


def parse_depth(h_eff: str | None, adaptive: str | None, train_loops: int,
                criterion: str = "kl") -> Depth:
    """``--h-eff N|adaptive:[CRITERION:]T[:MAX]`` or ``--adaptive [CRITERION:]T[:MAX]``
    (:meth:`ExitSpec.parse`; MAX defaults to the training loop count, as does a missing
    ``--h-eff``)."""
    if criterion not in CRITERIA:
        raise ConfigError(f"--adaptive-criterion {criterion!r} is not one of {list(CRITERIA)}")
    if h_eff is not None and adaptive is not None:
        raise ConfigError("--h-eff and --adaptive both given; pass one (--adaptive T[:MAX] "
                          "is --h-eff adaptive:T[:MAX])")
    if adaptive is not None:
        text = str(adaptive).strip()
        try:
            spec = ExitSpec.parse(text if ExitSpec.is_text(text) else f"adaptive:{text}",
                                  "--adaptive", criterion)
        except ConfigError as exc:
            raise ConfigError(f"--adaptive {adaptive!r} is not [CRITERION:]THRESHOLD[:MAX] "
                              f"({str(exc).split('; ')[0]}); use e.g. --adaptive 0.01, "
                              "--adaptive 0.01:8 or --adaptive gate:0.9") from None
        return _adaptive_depth(spec, train_loops)
    if h_eff is None:
        return Depth(train_loops)
    text = str(h_eff).strip()
    if ExitSpec.is_text(text):
        return _adaptive_depth(ExitSpec.parse(text, "--h-eff", criterion), train_loops)
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--h-eff {h_eff!r} is not a loop count; use --h-eff N with N >= 1 "
                          "(e.g. 4), or --h-eff adaptive:THRESHOLD[:MAX]")
    check_test_loops(int(text), "--h-eff")
    return Depth(int(text))


def _adaptive_depth(spec: ExitSpec, train_loops: int) -> Depth:
    spec = spec.with_max_loops(train_loops)
    return Depth(spec.max_loops, spec)


@dataclass(frozen=True)
class Sampling:
    """Greedy when ``temperature`` is 0; else nucleus sampling at that temperature, among
    the ``top_k`` most likely tokens when ``top_k`` is set (None: no cut)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    top_k: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"--temperature {self.temperature} must be a finite number >= 0 "
                              "(0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p {self.top_p} must lie in (0, 1] (1 = no cut)")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k {self.top_k} must be at least 1 (leave it out: no cut)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def pick_tokens(logits: torch.Tensor, sampling: Sampling,
                generator: torch.Generator | Sequence[torch.Generator]) -> list[int]:
    """Next token per row of ``logits`` [n, V] (fp32 on the CPU). ``generator``: one for
    all rows, or one per row (each row's draw then depends on its own generator alone)."""
    if sampling.greedy:
        return logits.argmax(dim=-1).tolist()
    # shifted so the top logit is 0, in float64: a temperature as small as 1e-300 (or a
    # subnormal one) divides to 0 and -inf, never inf - inf, so it samples the top token(s)
    shifted = logits.double() - logits.double().amax(dim=-1, keepdim=True)
    probs = torch.softmax(shifted / sampling.temperature, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass of the more likely tokens
    sorted_p = sorted_p.masked_fill(before >= sampling.top_p, 0.0)  # the top one always stays
    if sampling.top_k is not None:
        sorted_p[:, sampling.top_k:] = 0.0
    if isinstance(generator, torch.Generator):
        drawn = torch.multinomial(sorted_p, 1, generator=generator)  # [n, 1], renormalised
    else:
        drawn = torch.cat([torch.multinomial(sorted_p[i:i + 1], 1, generator=g)
                           for i, g in enumerate(generator)])
    return order.gather(-1, drawn).squeeze(-1).tolist()


@dataclass(frozen=True)
class CacheOptions:
    """How the KV cache is kept (``generate --kv-share/--kv-fill/--continuous``, see
    :mod:`pipeline_lib.model.kv_cache`): ``kv_fill`` matters under adaptive depth only."""

    kv_share: str = "per_loop"
    kv_fill: str = "latest"
    continuous: bool = False

    def __post_init__(self) -> None:
        share_every(self.kv_share, 1)
        check_kv_fill(self.kv_fill)

    def options(self) -> dict[str, Any]:
        return {"kv_share": self.kv_share, "kv_fill": self.kv_fill,
                "continuous": self.continuous}


@dataclass
class Generation:
    """One prompt's continuation."""

    prompt: str
    text: str
    ids: list[int]  # new tokens kept (EOS not kept)
    stop: str  # "eos" or "length"
    mean_loops: float  # loops computed per generated token (its exit under adaptive depth)
    kv_bytes: int = 0  # the largest KV cache of its batch (keys and values, allocated)
    kv_bytes_core: int = 0  # the core blocks' part of it (what kv_share shrinks)
    seconds: float = 0.0  # wall time of its batch's decoding (prefill included)
    tokens_per_s: float = 0.0  # its batch's new tokens (EOS not kept) per second

    @property
    def steps(self) -> int:
        """Forward passes of this row: one per kept token, one more for an EOS."""
        return len(self.ids) + (self.stop == "eos")

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "completion": self.text, "completion_ids": self.ids,
                "stop": self.stop, "mean_loops": round(self.mean_loops, 4),
                "kv_bytes": self.kv_bytes, "kv_bytes_core": self.kv_bytes_core,
                "seconds": round(self.seconds, 4), "tokens_per_s": round(self.tokens_per_s, 1)}


def summary_line(results: Sequence[Generation], seconds: float, max_loops: int) -> str:
    """One line for the terminal: new tokens, wall time and tokens/s of the whole run, loops
    computed per token (of ``max_loops``) and the largest KV cache (its core part)."""
    tokens = sum(len(r.ids) for r in results)
    steps = sum(r.steps for r in results)
    loops = sum(r.mean_loops * r.steps for r in results) / max(steps, 1)
    kv = max(results, key=lambda r: r.kv_bytes, default=None)
    return (f"generate: {len(results)} prompt(s), {tokens} new tokens in {seconds:.2f} s "
            f"({tokens / max(seconds, 1e-9):.1f} tokens/s); {loops:.2f} of {max_loops} loops "
            f"computed per token; KV cache {kv.kv_bytes if kv else 0} bytes "
            f"(core blocks {kv.kv_bytes_core if kv else 0})")


def encode_prompts(tok: Any, prompts: Sequence[str], context_len: int, eos: int
                   ) -> list[list[int]]:
    """Token ids of every prompt, begun as the pack began documents (its BOS, when its
    tokenizer.json adds one); an empty prompt without BOS starts after EOS, as documents do."""
    encoded = []
    for i, prompt in enumerate(prompts):
        ids = list(tok.encode(prompt).ids) or [eos]
        if len(ids) > context_len:
            raise UsageError(f"prompt {i + 1} has {len(ids)} tokens but the model's context is "
                             f"{context_len} (data.seq_len of the snapshot); shorten it to "
                             f"{context_len} tokens or fewer")
        encoded.append(ids)
    return encoded


class _TextStream:
    """Decoded text per row, handed on in whole characters as tokens arrive."""

    def __init__(self, tok: Any, n: int, on_text: Callable[[int, str], None] | None) -> None:
        self.tok, self.on_text = tok, on_text
        self.shown = [""] * n

    def update(self, i: int, new_ids: list[int], final: bool = False) -> str:
        text = self.tok.decode(new_ids, skip_special_tokens=True)
        ready = text if final else text.rstrip("\ufffd")  # an unfinished UTF-8 character
        if self.on_text is not None and len(ready) > len(self.shown[i]):
            self.on_text(i, ready[len(self.shown[i]):])
            self.shown[i] = ready
        return text


def _decode(model: torch.nn.Module, prompt_ids: list[list[int]], *, eos: int,
            max_new_tokens: int, depth: Depth, sampling: Sampling, generator: torch.Generator,
            context_len: int, stream: _TextStream, offset: int, cache: CacheOptions
            ) -> tuple[list[tuple[list[int], str, int]], CachedNextIds]:
    """((new ids, stop reason, Σ loops computed) per prompt of one batch, its decoder)."""
    loops = [0] * len(prompt_ids)
    rule = None if depth.exit is None else CriterionExit(model, depth.exit)
    cached = CachedNextIds(model, depth.loops, pad_id=eos, reserve=max_new_tokens,
                           exit_rule=rule, **cache.options())

    def next_ids(active: list[int], rows: list[list[int]]) -> list[int]:
        logits = cached.logits(active, rows).float().cpu()
        for i, n in zip(active, cached.loops, strict=True):
            loops[i] += n
        return pick_tokens(logits, sampling, generator)

    def shown(i: int, new_ids: list[int]) -> bool:
        stream.update(offset + i, new_ids)
        return False

    done = greedy_decode(next_ids, prompt_ids, [max_new_tokens] * len(prompt_ids), eos_id=eos,
                         context_len=context_len, stopped=shown)
    return [(new, stop, used) for (new, stop), used in zip(done, loops, strict=True)], cached


def generate_texts(model: torch.nn.Module, tok: Any, prompts: Sequence[str], *,
                   context_len: int, max_new_tokens: int, depth: Depth,
                   sampling: Sampling | None = None, batch_size: int = 16,
                   on_text: Callable[[int, str], None] | None = None,
                   cache: CacheOptions | None = None) -> list[Generation]:
    """Continuations of ``prompts`` (see the module docstring), ``batch_size`` at a time."""
    if max_new_tokens < 1 or batch_size < 1:
        raise ConfigError(f"--max-new-tokens {max_new_tokens} and --batch-size {batch_size} "
                          "must be at least 1")
    sampling, cache = sampling or Sampling(), cache or CacheOptions()
    eos = eos_id(tok)
    prompt_ids = encode_prompts(tok, prompts, context_len, eos)
    generator = torch.Generator().manual_seed(sampling.seed)
    stream = _TextStream(tok, len(prompts), on_text)
    model.eval()
    out: list[Generation] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompt_ids[start:start + batch_size]
        started = time.perf_counter()
        decoded, cached = _decode(model, chunk, eos=eos, max_new_tokens=max_new_tokens,
                                    depth=depth, sampling=sampling, generator=generator,
                                    context_len=context_len, stream=stream, offset=start,
                                    cache=cache)
        seconds = time.perf_counter() - started
        rate = sum(len(new) for new, _, _ in decoded) / max(seconds, 1e-9)
        for i, (new, stop, used) in enumerate(decoded, start):
            text = stream.update(i, new, final=True)
            row = Generation(prompts[i], text, new, stop, 0.0, cached.kv_bytes,
                             cached.kv_bytes_core, seconds, rate)
            row.mean_loops = used / max(row.steps, 1)  # an EOS's pass computed loops too
            out.append(row)
    return out
