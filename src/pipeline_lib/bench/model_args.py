"""``--model_args`` of the ``loopline`` lm-eval model, checked before anything loads.

lm-eval hands every value over as a string (``h_eff=4``, ``use_ema=true``); in process they
may come as Python objects. Each parser accepts both and raises a :class:`ConfigError` that
names the key, the bad value and the fix.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ..data.tokenizer import load_tokenizer
from ..device import DEVICE_CHOICES, resolve_device
from ..errors import ConfigError, DeviceError
from ..evaluate.exit.spec import CRITERIA, ExitSpec
from ..evaluate.generation import CacheOptions
from ..model.kv_cache import KV_SHARES, share_every
from ..precision import Precision
from ..spec.rules import KV_FILLS, check_test_loops

log = logging.getLogger(__name__)

MODEL_ARGS = ("snapshot", "h_eff", "batch_size", "device", "use_ema", "tokenizer", "max_gen_toks",
              "max_batch_size", "adaptive_criterion", "precision", "kv_share", "kv_fill", "seed")
DEFAULT_BATCH_SIZE = 16
DEFAULT_MAX_GEN_TOKS = 256


def as_int(name: str, value: Any, minimum: int) -> int:
    """``value`` (an int, or its text) as an integer ≥ ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, str, float)):
        raise ConfigError(f"loopline model_args {name}={value!r} is not an integer; "
                          f"pass {name}=N with N >= {minimum}")
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"loopline model_args {name}={value!r} is not an integer; "
                          f"pass {name}=N with N >= {minimum}") from None
    if number != value and not isinstance(value, str) or number < minimum:
        raise ConfigError(f"loopline model_args {name}={value!r} must be an integer >= {minimum}")
    return number


def as_bool(name: str, value: Any) -> bool:
    """``value`` (a bool, 0/1, or true/false/1/0 as text) as a bool."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"loopline model_args {name}={value!r} is not a boolean; use true or false")


def h_eff_arg(value: Any, criterion: str = "kl") -> int | ExitSpec:
    """``h_eff``: a loop count ≥ 1, or an adaptive exit ``adaptive:[CRITERION:]T[:MAX]``
    (:meth:`ExitSpec.parse`; ``criterion`` when the value names none)."""
    if ExitSpec.is_text(value):
        try:
            return ExitSpec.parse(value.strip(), "h_eff", criterion)
        except ConfigError as exc:
            raise ConfigError(f"loopline model_args {exc}") from None
    loops = as_int("h_eff", value, 1)
    check_test_loops(loops, "loopline model_args h_eff")
    return loops


def criterion_arg(value: Any) -> str:
    """``adaptive_criterion``: the criterion of an ``h_eff=adaptive:…`` that names none."""
    if value not in CRITERIA:
        raise ConfigError(f"loopline model_args adaptive_criterion={value!r} is not one of "
                          f"{list(CRITERIA)}; pick one")
    return value


def cache_arg(kv_share: Any, kv_fill: Any) -> CacheOptions:
    """``kv_share=per_loop|last|every:K`` and ``kv_fill=latest|skip``: how generative
    requests keep their KV cache (:mod:`pipeline_lib.model.kv_cache`; ``kv_fill`` matters
    under ``h_eff=adaptive:…`` only). Scored requests compute whole windows, no cache."""
    share = "per_loop" if kv_share in (None, "") else str(kv_share)
    fill = "latest" if kv_fill in (None, "") else str(kv_fill)
    try:
        share_every(share, 1)
    except ConfigError:
        raise ConfigError(f"loopline model_args kv_share={kv_share!r} is not one of "
                          f"{KV_SHARES}; pass e.g. kv_share=last or kv_share=every:2") from None
    if fill not in KV_FILLS:
        raise ConfigError(f"loopline model_args kv_fill={kv_fill!r} is not one of "
                          f"{list(KV_FILLS)}; pass kv_fill=latest (a stopped position's last "
                          "loop) or kv_fill=skip (masked past it)")
    return CacheOptions(share, fill)


def model_device(device: Any) -> torch.device:
    """``auto``/``cpu``/``cuda``/``npu`` as ``experiment.device`` means; also ``cuda:N``."""
    name = "auto" if device in (None, "") else str(device)
    if name in DEVICE_CHOICES:
        return resolve_device(name)
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"loopline model_args device={device!r} is not a torch device; "
                          f"use one of {list(DEVICE_CHOICES)} or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"loopline model_args device={device!r} asks for CUDA, which this "
                          "machine does not have; use device=cpu")
    return dev


def precision_arg(value: Any, device: torch.device) -> Any:
    """``precision=auto|bf16|fp32`` (as ``experiment.precision``) resolved on ``device``."""
    name = "auto" if value in (None, "") else str(value)
    return Precision.resolve(name, device, key="loopline model_args precision")


def batch_size_arg(value: Any) -> int:
    """Requests per model batch; ``auto…`` (lm-eval's batch-size search) is not searched."""
    if value is None:
        return DEFAULT_BATCH_SIZE
    if isinstance(value, str) and value.startswith("auto"):
        log.info("loopline: batch_size=%s is not searched; using %d", value, DEFAULT_BATCH_SIZE)
        return DEFAULT_BATCH_SIZE
    return as_int("batch_size", value, 1)


def tokenizer_arg(tokenizer: Any) -> Any:
    """The tokenizer of an in-process model: a ``tokenizers.Tokenizer`` or a tokenizer.json path."""
    if tokenizer is None:
        raise ConfigError("loopline: a model object needs tokenizer= (a tokenizers.Tokenizer "
                          "or the path of a tokenizer.json)")
    if isinstance(tokenizer, (str, Path)):
        return load_tokenizer(tokenizer)
    return tokenizer
