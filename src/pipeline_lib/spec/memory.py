"""How much memory a config needs at least, by arithmetic on the config: no torch import.

One estimator for every entry point (a training segment, a snapshot loaded for evaluation,
an import from a pretrained source), checked against what the machine has by
:func:`pipeline_lib.memory_check.check_memory` before anything is allocated. The estimate
is a *lower bound*, so that a config that runs is never refused:

- **state**: fp32 weights (``spec.size.param_count``: every expert of an MoE layer counted),
  fp32 gradients and the optimizer's state (AdamW and AdamAtan2 keep two fp32 moments, Muon
  one momentum on the hidden matrices and two moments on the rest: four bytes per parameter
  at least) and an EMA copy (``train.ema_decay``). With ``train.freeze`` no gradient or
  optimizer state is counted (the frozen share is not worked out here). Sharded over
  ``world_size`` ranks (FSDP), each rank holds its share, but builds the whole fp32 model
  first.
- **activations** of one micro-batch (``train.micro_batch_rows`` × ``data.seq_len`` tokens):
  each block application that carries gradients saves at least its input (``d_model`` values
  per token, two bytes at the least: bf16), whatever ``train.activation_checkpointing``
  does; the applications are the prelude and the coda once and the core's blocks once per
  loop with gradients (``train.bptt``: all of the fewest loops a step runs under ``full``,
  ``k`` under ``truncated`` and ``unrolled``, one under ``progressive``; one input per loop
  under ``activation_checkpointing: loop``; one alone with ``train.freeze``).
  Plus the chunked cross-entropy's logits buffer (``model.loss_chunk_size`` × vocabulary,
  fp32) and the micro-batch's token ids.

What it leaves out (attention and FFN intermediates, the teacher of a distillation, the
allocator's fragmentation, the process itself) only makes the real need larger.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Config
from .config_model import ModelConfig
from .size import param_count

GIB = 1 << 30
FP32 = 4  # bytes of a weight, a gradient, one optimizer moment, a logit
HALF = 2  # bytes of an activation at the least (bf16)
TOKEN_ID = 8  # int64 ids: inputs and targets of a batch
# optimizer state per trainable parameter, at least (Muon: one momentum on the matrices)
OPTIMIZER_BYTES = {"adamw": 2 * FP32, "adamatan2": 2 * FP32, "muon": FP32}


@dataclass(frozen=True)
class MemoryEstimate:
    """At least ``total`` bytes: ``parts`` (label → bytes, for the message), ``subject`` (what
    drives it, keys and values) and ``fix`` (what to lower)."""

    parts: tuple[tuple[str, int], ...]
    subject: str
    fix: str

    @property
    def total(self) -> int:
        return sum(size for _, size in self.parts)

    def describe(self) -> str:
        """``weights 48 GiB, gradients 48 GiB, …`` (parts of zero left out)."""
        return ", ".join(f"{label} {format_bytes(size)}" for label, size in self.parts if size)


def format_bytes(size: float) -> str:
    """``1.2 TiB``, ``23 GiB``, ``512 MiB``: three significant digits at most."""
    for unit, scale in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", GIB), ("MiB", 1 << 20)):
        if size >= scale:
            value = size / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    return f"{max(size, 0) / 1024:.3g} KiB"


def model_subject(model: ModelConfig) -> str:
    """``model.d_model = 65536, model.vocab_size = 258 (103 B parameters)``."""
    return (f"model.d_model = {model.d_model}, model.vocab_size = {model.vocab_size} "
            f"({param_count(model) / 1e9:.3g} B parameters)")


def gradient_applications(cfg: Config) -> int:
    """Block applications of one training step that save activations for the backward
    pass, at the least (see the module docstring)."""
    t, m = cfg.train, cfg.model
    if t.freeze:
        return 1
    sampling = t.loop_sampling
    fewest = (m.loops if sampling.mode == "fixed" and not sampling.ramp_steps
              else sampling.min_loops if sampling.mode in ("fixed", "uniform") else 1)
    with_grad = {"full": fewest, "progressive": 1}.get(t.bptt.mode, min(t.bptt.k, fewest))
    per_loop = 1 if t.activation_checkpointing == "loop" else m.core_layers  # loop: its input
    return m.prelude_layers + m.coda_layers + per_loop * max(1, with_grad)


def activation_bytes(model: ModelConfig, rows: int, seq_len: int, applications: int) -> int:
    """Saved block inputs, the loss's logits buffer and the token ids of ``rows`` ×
    ``seq_len`` tokens through ``applications`` block applications."""
    tokens = rows * seq_len
    logits = min(model.loss_chunk_size, tokens) * model.vocab_size * FP32
    return tokens * (model.d_model * HALF * applications + 2 * TOKEN_ID) + logits


def training_memory(cfg: Config, *, world_size: int = 1, processes: int = 1,
                    accelerator: bool = False) -> MemoryEstimate:
    """Memory ``processes`` ranks of a ``world_size``-rank segment need together, at the
    least: one rank on an ``accelerator`` (its own device), the ranks of a host on the CPU
    (they share its memory). ``cfg`` is resolved (``model.vocab_size`` from the pack)."""
    t, m = cfg.train, cfg.model
    params = param_count(m)
    trainable = 0 if t.freeze else params
    state = [("weights", FP32 * params), ("gradients", FP32 * trainable),
             (f"{t.optimizer} state", OPTIMIZER_BYTES.get(t.optimizer, 0) * trainable),
             ("EMA", FP32 * params if t.ema_decay > 0 else 0)]
    if world_size > 1:  # FSDP shards; each rank built the whole fp32 model first
        share = -(-sum(size for _, size in state) // world_size)
        whose = f"{processes} ranks' shares" if processes > 1 else f"a rank's 1/{world_size} share"
        state = [(f"{whose} of weights, gradients and {t.optimizer} state (each builds the "
                  "whole fp32 model first)",
                  max(share, FP32 * params))]
    per_rank = sum(size for _, size in state)
    acts = activation_bytes(m, t.micro_batch_rows, cfg.data.seq_len, gradient_applications(cfg))
    parts = [(label, size * processes) for label, size in state]
    batch = (f"activations of train.micro_batch_rows × data.seq_len = {t.micro_batch_rows} × "
             f"{cfg.data.seq_len} tokens")
    parts.append((batch + (f" × {processes} processes" if processes > 1 else ""),
                  acts * processes))
    if acts > per_rank:
        return MemoryEstimate(tuple(parts), f"train.micro_batch_rows × data.seq_len = "
                              f"{t.micro_batch_rows} × {cfg.data.seq_len} (model.d_model = "
                              f"{m.d_model})", "lower train.micro_batch_rows (with "
                              "train.global_batch_rows unchanged a step takes more micro-"
                              "batches) or data.seq_len")
    more = " or shard it over more devices (train.nproc)" if accelerator else ""
    return MemoryEstimate(tuple(parts), model_subject(m),
                          f"lower model.d_model, model.vocab_size or the layers{more}")


def inference_memory(model: ModelConfig, *, rows: int = 0, seq_len: int = 0,
                     rows_key: str = "", subject: str = "") -> MemoryEstimate:
    """Memory of ``model``'s fp32 weights and, with ``rows`` > 0, of a forward pass over
    ``rows`` × ``seq_len`` tokens (``rows_key``: the key that sets ``rows``): the residual
    stream of one block and the loss's logits buffer. ``subject``: what the model is
    (default: its size keys)."""
    params = param_count(model)
    acts = activation_bytes(model, rows, seq_len, 1) if rows else 0
    batch = f"{rows_key} × data.seq_len = {rows} × {seq_len}"
    parts = (("weights", FP32 * params), (f"activations of {batch} tokens", acts))
    if acts > FP32 * params:
        return MemoryEstimate(parts, f"{batch} (model.d_model = {model.d_model})",
                              f"lower {rows_key}")
    return MemoryEstimate(parts, subject or model_subject(model),
                          "use a machine with more memory (or a smaller model)")


__all__ = ["MemoryEstimate", "activation_bytes", "format_bytes", "gradient_applications",
           "inference_memory", "model_subject", "training_memory"]
