"""lm-eval's ``generate_until`` for :class:`~pipeline_lib.bench.lm_wrapper.LooplineLM`:
greedy or sampled answers through the KV cache.

Each request decodes as its ``generation_kwargs`` say (:func:`.lm_requests.generation_settings`:
``until``, ``max_gen_toks``, ``do_sample``, ``temperature``, ``top_p``, ``top_k``), all of them
checked before the first forward pass. A sampled request draws its tokens with the sampler of
``generate`` (:func:`pipeline_lib.evaluate.generation.pick_tokens`) from a generator of its
own, seeded by (``seed`` model arg, task, doc_id, request index, repeat, H_eff)
(:func:`.lm_requests.request_seed`): the n-th of a task's ``repeats`` copies of a request is
repeat n, and no draw depends on which requests run before it or beside it. So the same seed
gives the same answers run after run, a rerun of part of the requests (a resumed stage) gives
those requests' answers again, and a request's answer does not depend on the batch it is in
as long as its logits do not (the model is causal and right-padded, so only float rounding of
a batched product can differ). A greedy request takes the argmax of the same logits as before
sampling existed, bit for bit, sampled neighbours or not.

The KV cache and adaptive exit are as for greedy decoding (:class:`CachedNextIds`): every
generated token counts its loops computed per (task, doc_id), every answer counts once
(:meth:`.loops_used.LoopsUsed.add_answer`), so loops per answer are known per task.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from tqdm import tqdm

from ..evaluate.exit.cached import CriterionExit
from ..evaluate.generation import pick_tokens
from ..model.generate import CachedNextIds, greedy_decode
from .lm_requests import (
    GenSettings,
    cut_at_stops,
    generation_settings,
    repeat_indices,
    request_seed,
)
from .loops_used import DocKey

log = logging.getLogger(__name__)

def doc_key(request: Any) -> DocKey:
    """(task name, doc_id) of an lm-eval ``Instance``; None for what a bare request lacks."""
    return getattr(request, "task_name", None), getattr(request, "doc_id", None)


class UntilGeneration:
    """The ``generate_until`` half of the lm-eval model (a mixin: the model, its cache
    options, depth, precision, tokenizer and loop counts live on ``self``)."""

    seed: int

    def _settings(self, request: Any) -> GenSettings:
        task = doc_key(request)[0] or "unknown"
        gen_kwargs = dict(request.args[1] or {})
        if gen_kwargs.get("do_sample") is False and float(gen_kwargs.get("temperature") or 0):
            if "do_sample" not in self._warned:
                self._warned.add("do_sample")
                log.warning("loopline: task %s sets do_sample false: greedy, its "
                                  "temperature is not used", task)
        return generation_settings(gen_kwargs, self.max_gen_toks, task)

    def _generators(self, requests: list[Any], settings: list[GenSettings]
                    ) -> list[torch.Generator | None]:
        """One seeded generator per sampled request (None for greedy ones)."""
        keys = [(*doc_key(r), getattr(r, "idx", 0), r.args[0]) for r in requests]
        out: list[torch.Generator | None] = []
        for (task, doc_id, idx, context), repeat, s in zip(keys, repeat_indices(keys), settings,
                                                            strict=True):
            seed = request_seed(self.seed, task, doc_id, idx, repeat, str(self.h_eff), context)
            out.append(None if s.sampling is None else torch.Generator().manual_seed(seed))
        return out

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        settings = [self._settings(r) for r in requests]  # every request checked first
        generators = self._generators(requests, settings)
        prompts = [self.tok_encode(ctx) or [self._eos] for ctx, _ in (r.args for r in requests)]
        outputs = [""] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: -len(prompts[i]))
        bar = tqdm(total=len(requests), desc=f"generate h_eff={self.h_eff}", disable=disable_tqdm)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            keys = [doc_key(requests[i]) for i in chunk]
            texts = self._generate_batch([prompts[i] for i in chunk],
                                         [settings[i] for i in chunk], keys,
                                         [generators[i] for i in chunk])
            for i, key, text in zip(chunk, keys, texts, strict=True):
                outputs[i] = text
                self.loops_used.add_answer(*key)
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
            bar.update(len(chunk))
        bar.close()
        return outputs

    def _generate_batch(self, prompts: list[list[int]], settings: list[GenSettings],
                        keys: list[DocKey] | None = None,
                        generators: list[torch.Generator | None] | None = None) -> list[str]:
        """Continuations of ``prompts``; each row stops on its own, decoded with the KV cache
        (``kv_share``, ``kv_fill``) at a fixed h_eff or with adaptive exit (each token's later
        loops not computed: :mod:`pipeline_lib.model.kv_adaptive`). Rows with a ``sampling``
        draw from their own generator, the others take the argmax. Every generated token (the
        final EOS included) counts its loops computed for its (task, doc_id), and the batch's
        cache bytes count for every task in it."""
        keys = keys or [(None, None)] * len(prompts)
        generators = generators or [None] * len(prompts)
        texts = [""] * len(prompts)
        budgets = [s.max_gen for s in settings]
        rule = None if self._exit is None else CriterionExit(self.model, self._exit, "h_eff")
        cached = CachedNextIds(self.model, self._h_eff, pad_id=self._eos, device=self._device,
                               reserve=max(budgets, default=0), exit_rule=rule,
                               **self._cache.options())

        def next_ids(active: list[int], rows: list[list[int]]) -> list[int]:
            logits = cached.logits(active, rows)  # [len(active), V] on the device
            out = logits.argmax(dim=-1).tolist()  # greedy rows: as CachedNextIds itself picks
            drawn = [j for j, i in enumerate(active) if settings[i].sampling is not None]
            if drawn:
                picked = logits[drawn].float().cpu()
                for row, j in enumerate(drawn):
                    i = active[j]
                    out[j] = pick_tokens(picked[row:row + 1], settings[i].sampling,
                                         [generators[i]])[0]
            for i, used in zip(active, cached.loops, strict=True):
                self.loops_used.add(*keys[i], (used,), generated=True)
            return out

        def stopped(i: int, new_ids: list[int]) -> bool:
            texts[i], found = cut_at_stops(self.tok_decode(new_ids), settings[i].stops)
            return found

        with torch.inference_mode(), self._precision.autocast():
            greedy_decode(next_ids, prompts, budgets, eos_id=self._eos,
                          context_len=self.seq_len, stopped=stopped)
        self.loops_used.add_cache([task for task, _ in keys], cached.kv_bytes,
                                  cached.kv_bytes_core)
        return texts
