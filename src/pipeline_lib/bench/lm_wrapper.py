"""A loopline snapshot as an lm-evaluation-harness ``LM``, registered as ``loopline``.

``--model loopline --model_args snapshot=DIR,h_eff=N,batch_size=B,device=cpu[,use_ema=true]``
(``precision=auto|bf16|fp32`` as ``experiment.precision``; the model, the log-softmax and
the target gather run on the device, and only the scored values come back).

Every score is read out after ``h_eff`` loops of the core block (any count ≥ 1, also beyond
the training loop count), so one loaded model serves a whole H_eff sweep: set
:attr:`LooplineLM.h_eff` between ``simple_evaluate`` calls.

``h_eff=adaptive:[CRITERION:]THRESHOLD[:MAX]`` (e.g. ``adaptive:gate:0.9``: the learned
exit gate; any criterion of :mod:`pipeline_lib.evaluate.exit.criteria`, parsed by
:meth:`~pipeline_lib.evaluate.exit.spec.ExitSpec.parse`) reads every token out at its own
adaptive exit instead (:mod:`pipeline_lib.evaluate.exit`): the first loop whose next-token distribution
differs from the previous loop's by a KL divergence below THRESHOLD (or, with
``adaptive_criterion=entropy``, whose entropy is below it), at most MAX loops (default: the
training loop count). Scoring and generation both use it; the loops used (the exit loop of
every scored or generated token; a generated token computes only those, a scored one all
MAX) are counted per task and document in :attr:`LooplineLM.loops_used` (:mod:`.loops_used`,
with each task's largest KV cache of its generative requests) and averaged per task in
:attr:`LooplineLM.mean_loops`, which lm-eval also writes into its results
(``config.mean_loops``).

- ``loglikelihood``: exact log-probability of the continuation tokens given the context,
  and whether greedy decoding would produce them. Contexts longer than the model's
  ``seq_len`` are left-truncated; a continuation longer than ``seq_len`` is scored in
  windows (as ``loglikelihood_rolling`` does), so every token is scored exactly once.
- ``loglikelihood_rolling``: the document after an EOS prefix, in windows of ``seq_len``
  (lm-eval's ``get_rolling_token_windows`` layout, context length 1).
- ``generate_until`` (:mod:`.lm_generation`): greedy, or sampled as the request's
  ``do_sample``/``temperature``/``top_p``/``top_k`` say, each sampled answer from a generator
  seeded by (``seed=N``, task, doc_id, repeat, H_eff); with a KV cache
  (:mod:`pipeline_lib.model.kv_cache`), stops at EOS, at the first stop string (``until``;
  the returned text ends before it) or after ``max_gen_toks`` tokens.
  ``kv_share=per_loop|last|every:K`` and ``kv_fill=latest|skip`` choose how the cache is
  kept, as ``generate --kv-share/--kv-fill`` do (defaults ``per_loop``, ``latest``;
  ``kv_fill`` under ``h_eff=adaptive:…`` only).

Batches are right-padded: the model is causal, so padding after a row's last real token
never changes the logits at that token or before it (no attention mask needed).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lm_eval.api.metrics  # noqa: F401  (registers the aggregations, "mean" among them)
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_metric, register_model
from lm_eval.utils import simple_parse_args_string
from tqdm import tqdm

from ..data.tokenizer import eos_id
from ..errors import ConfigError
from ..evaluate.exit.criteria import adaptive_logits, check_model_criterion
from ..evaluate.exit.spec import ExitSpec
from ..evaluate.loading import load_for_eval
from ..model.generate import padded_rows
from ..spec.names import SAMPLES_METRIC
from .lm_generation import UntilGeneration, doc_key
from .lm_requests import Window, score_windows
from .loops_used import DocKey, LoopsUsed
from .model_args import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_GEN_TOKS,
    MODEL_ARGS,
    as_bool,
    as_int,
    batch_size_arg,
    cache_arg,
    criterion_arg,
    h_eff_arg,
    model_device,
    precision_arg,
    tokenizer_arg,
)
from .sampled import sampled_answers
from .target_scores import target_scores

log = logging.getLogger(__name__)

# the metric of tasks that sample several answers (pass@k, maj@k): .sampled
register_metric(metric=SAMPLES_METRIC, higher_is_better=True, aggregation="mean")(sampled_answers)


@register_model("loopline")
class LooplineLM(UntilGeneration, TemplateLM):
    """lm-eval model over a loopline ``LoopedLM`` read out after ``h_eff`` loops.

    Build it from ``snapshot=DIR`` (what lm-eval does with ``--model_args``), or in process
    from objects: ``LooplineLM(model=looped_lm, tokenizer=tokenizers.Tokenizer, seq_len=…)``.
    """

    def __init__(
        self,
        snapshot: str | Path | None = None,
        h_eff: int | str | None = None,
        batch_size: int | str | None = DEFAULT_BATCH_SIZE,
        device: str | None = "cpu",
        use_ema: bool | str = False,
        tokenizer: Any = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        max_batch_size: int | None = None,
        adaptive_criterion: str = "kl",
        precision: str | None = "auto",
        kv_share: str = "per_loop",
        kv_fill: str = "latest",
        seed: int | str = 0,
        *,
        model: torch.nn.Module | None = None,
        seq_len: int | None = None,
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            raise ConfigError(f"unknown loopline model_args key(s) {sorted(unknown)}; "
                              f"known keys: {', '.join(MODEL_ARGS)}")
        self._default_criterion = criterion_arg(adaptive_criterion)
        self._cache = cache_arg(kv_share, kv_fill)
        if h_eff is not None:
            h_eff_arg(h_eff, self._default_criterion)  # fail before loading
        self._device = model_device(device)
        self._precision = precision_arg(precision, self._device)
        self.batch_size = batch_size_arg(batch_size)
        self.max_gen_toks = as_int("max_gen_toks", max_gen_toks, 1)
        self.seed = as_int("seed", seed, 0)  # of every sampled answer (.lm_generation)
        self.snapshot: Path | None = None
        self.step: int | None = None
        self.config: Any = None
        if model is None:
            model, tok, seq_len, default_h_eff = self._load_snapshot(
                snapshot, use_ema, tokenizer, seq_len)
        else:
            if snapshot not in (None, ""):
                raise ConfigError("loopline: pass either snapshot=DIR or a model object, not both")
            tok = tokenizer_arg(tokenizer)
            if seq_len is None:
                raise ConfigError("loopline: a model object needs seq_len= (its context length)")
            default_h_eff = getattr(getattr(model, "cfg", None), "loops", None)
        self.tokenizer = tok
        self.seq_len = as_int("seq_len", seq_len, 1)
        self.model = model.to(self._device).eval()
        self._default_loops = default_h_eff
        self._exit: ExitSpec | None = None
        self.loops_used = LoopsUsed()  # (task, doc_id) → tokens per loops used
        self._request_keys: list[DocKey] | None = None
        self.h_eff = default_h_eff if h_eff is None else h_eff
        self._eos = eos_id(tok)
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ configuration

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any],
                            additional_config: dict[str, Any] | None = None) -> LooplineLM:
        """``--model_args`` win over lm-eval's own ``--batch_size``/``--device``.

        lm-eval's CLI always passes those, with defaults batch size 1 and ``cuda:0``; a CUDA
        device that did not come from ``--model_args`` falls back to the CPU when absent.
        """
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        if str(extra.get("device", "")).startswith("cuda") and not torch.cuda.is_available():
            extra.pop("device")
        return cls(**{**extra, **arg_dict})

    @classmethod
    def create_from_arg_string(cls, arg_string: str,
                               additional_config: dict[str, Any] | None = None) -> LooplineLM:
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    def _load_snapshot(self, snapshot: str | Path | None, use_ema: bool | str, tokenizer: Any,
                       seq_len: int | None) -> tuple[torch.nn.Module, Any, int, int]:
        """Model, tokenizer, context length and training loop count of ``snapshot=DIR``;
        records the snapshot's path, step and config on ``self``."""
        if snapshot in (None, ""):
            raise ConfigError("loopline model_args need snapshot=DIR (a snapshot directory "
                              "with MANIFEST.json), e.g. snapshot=results/base/snapshots/final")
        loaded = load_for_eval(Path(str(snapshot)), use_ema=as_bool("use_ema", use_ema),
                                tokenizer=tokenizer, device=self._device)
        self.config, self.snapshot, self.step = loaded.config, loaded.path, loaded.step
        return (loaded.model, loaded.tokenizer, seq_len or loaded.seq_len,
                loaded.config.model.loops)

    @property
    def h_eff(self) -> int | str:
        """Loop count at which every score is read out, or ``adaptive:[CRITERION:]T:MAX``
        (the criterion named unless it is the ``adaptive_criterion`` model arg)."""
        if self._exit is not None:
            return self._exit.text(self._default_criterion)
        return self._h_eff

    @h_eff.setter
    def h_eff(self, value: Any) -> None:
        if value is None:
            raise ConfigError("loopline model_args need h_eff=N (test-time loops, N >= 1)")
        parsed = h_eff_arg(value, self._default_criterion)
        if not isinstance(parsed, ExitSpec):
            self._exit, self._h_eff = None, parsed
            return
        check_model_criterion(self.model, parsed.criterion, "loopline model_args h_eff")
        if not parsed.max_loops and self._default_loops is None:
            raise ConfigError(f"loopline model_args h_eff={value!r}: this model has no "
                              "training loop count to default MAX to; pass "
                              "h_eff=adaptive:THRESHOLD:MAX")
        self._exit = parsed.with_max_loops(self._default_loops or 0)
        self._h_eff = self._exit.max_loops

    @property
    def adaptive(self) -> ExitSpec | None:
        """The adaptive exit every score is read out at (its MAX filled), else None."""
        return self._exit

    @property
    def mean_loops(self) -> dict[str, float]:
        """Mean loops used per scored or generated token, per task (since the last
        :meth:`reset_loop_stats`); requests without a task name count as ``unknown``."""
        return self.loops_used.mean_per_task()

    def reset_loop_stats(self) -> None:
        self.loops_used.clear()

    @property
    def eot_token_id(self) -> int:
        return self._eos

    @property
    def max_length(self) -> int:
        return self.seq_len

    @property
    def tokenizer_name(self) -> str:
        return f"loopline-{self.tokenizer.get_vocab_size()}"

    def get_model_info(self) -> dict[str, Any]:
        """Added by lm-eval to ``results["config"]``."""
        info = {"snapshot": str(self.snapshot) if self.snapshot else None, "step": self.step,
                "h_eff": self.h_eff, "seq_len": self.seq_len, "device": str(self._device),
                "precision": self._precision.name}
        if self._exit is not None:
            info["adaptive_criterion"] = self._exit.criterion
            info["mean_loops"] = self.mean_loops
        return info

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
                   ) -> list[int]:
        return list(self.tokenizer.encode(string, add_special_tokens=False).ids)

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def _forward(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits [B, L, V] of right-padded ``rows``, the loops each position was read out
        after [B, L] (its adaptive exit, or h_eff) and the lengths [B]; all on the device."""
        ids, lengths = padded_rows(rows, self._eos, self._device)
        with self._precision.autocast():
            if self._exit is not None:
                logits, loops = adaptive_logits(self.model, ids, self._exit)
            else:
                logits = self.model.logits_at(ids, self._h_eff)  # [B, L, V]
                loops = torch.full(ids.shape, self._h_eff, dtype=torch.long, device=ids.device)
        return logits, loops, lengths

    def _score_windows(self, windows: list[Window], desc: str, disable_tqdm: bool
                       ) -> list[tuple[float, bool, tuple[int, ...]]]:
        """(sum of target log-probs, all targets greedy, loops used per target) per window,
        batched by length."""
        order = sorted(range(len(windows)), key=lambda i: -len(windows[i][0]))
        out: list[tuple[float, bool, tuple[int, ...]]] = [(0.0, True, ())] * len(windows)
        bar = tqdm(total=len(windows), desc=desc, disable=disable_tqdm)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            batch = [windows[i] for i in chunk]
            logits, loops, _ = self._forward([inputs for inputs, _ in batch])
            for i, scores in zip(chunk, target_scores(logits, loops, batch), strict=True):
                out[i] = scores
            bar.update(len(chunk))
        bar.close()
        return out

    def _windows_for(self, context: list[int], continuation: list[int]) -> list[Window]:
        if len(context) + len(continuation) > self.seq_len + 1 and "truncate" not in self._warned:
            self._warned.add("truncate")
            log.warning("loopline: a request is longer than seq_len=%d tokens; its context is "
                        "left-truncated", self.seq_len)
        return score_windows(context, continuation, self.seq_len)

    # ------------------------------------------------------------------ lm-eval API

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False
                      ) -> list[tuple[float, bool]]:
        """lm-eval's tokenisation, then :meth:`_loglikelihood_tokens`; the requests' task
        names and doc ids are kept (in order) to count loops used per task and document."""
        self._request_keys = [doc_key(r) for r in requests]
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        finally:
            self._request_keys = None

    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any
                              ) -> list[tuple[float, bool]]:
        windows: list[Window] = []
        owner: list[int] = []
        for r, (_, context, continuation) in enumerate(requests):
            for window in self._windows_for(context, continuation):
                windows.append(window)
                owner.append(r)
        scored = self._score_windows(windows, f"loglikelihood h_eff={self.h_eff}", disable_tqdm)
        keys = self._request_keys
        if keys is None or len(keys) != len(requests):
            keys = [(None, None)] * len(requests)
        results = [(0.0, True)] * len(requests)
        for r, (logprob, greedy, used) in zip(owner, scored, strict=True):
            results[r] = (results[r][0] + logprob, results[r][1] and greedy)
            self.loops_used.add(*keys[r], used)
        for (pair, _, _), result in zip(requests, results, strict=True):
            if pair is not None:
                self.cache_hook.add_partial("loglikelihood", pair, result)
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False
                              ) -> list[float]:
        windows: list[Window] = []
        owner: list[int] = []
        for r, request in enumerate(requests):
            (string,) = request.args
            for window in score_windows([self._eos], self.tok_encode(string), self.seq_len):
                windows.append(window)
                owner.append(r)
        scored = self._score_windows(windows, f"rolling h_eff={self.h_eff}", disable_tqdm)
        totals = [0.0] * len(requests)
        for r, (logprob, _, used) in zip(owner, scored, strict=True):
            totals[r] += logprob
            self.loops_used.add(*doc_key(requests[r]), used)
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals
