"""Cross-field rules within one section of the config (or between train and model),
apart from the dataclasses: sources, the tokenizer, ``train.optimizer = muon``,
``train.freeze`` and ``train.activation_checkpointing`` with ``train.compile``.

:func:`pipeline_lib.config.validate_config` calls them after the generic field checks
(:mod:`pipeline_lib.config_fields`); below :mod:`pipeline_lib.config` in the layers, so
the sections come in as arguments (read by attribute) and nothing here imports them.
Each raises a one-line ConfigError naming the key and the fix. :data:`FREEZE_PARTS` is
the vocabulary of ``train.freeze``; what each part holds in the model is
:mod:`pipeline_lib.train.freeze`.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

ANSWER_FIELD_SOURCE_TYPES = ("jsonl", "parquet")  # sources that read prompt/answer/level fields
FREEZE_PARTS = ("embeddings", "prelude", "core", "coda", "head", "norm", "adapter")


def model_parts(model: Any) -> list[str]:
    """The :data:`FREEZE_PARTS` the architecture ``model`` (a ``ModelConfig``) has parameters
    for: no prelude or coda without layers, no head of its own when tied to the embedding,
    an adapter only with linear injection (``injection_proj``) or a learnable λ."""
    has = {"prelude": model.prelude_layers > 0, "coda": model.coda_layers > 0,
           "head": not model.tie_embeddings,
           "adapter": model.injection == "linear" or model.learn_injection_scale}
    return [part for part in FREEZE_PARTS if has.get(part, True)]


def check_optimizer_and_freeze(train: Any, model: Any) -> None:
    """Muon runs in one process; ``train.freeze`` names parts the model has, and not all of
    them (``train``: a ``TrainConfig``, ``model``: a ``ModelConfig``). Raises ConfigError."""
    world = train.nproc * train.nnodes
    if train.optimizer == "muon" and world > 1:
        raise ConfigError(f"train.optimizer = muon runs in one process, not train.nproc × "
                          f"train.nnodes = {world} (FSDP shards each matrix, Newton–Schulz "
                          "needs it whole); set train.nproc=1 and train.nnodes=1 or use adamw")
    present = model_parts(model)
    if "head" in train.freeze and model.tie_embeddings and "embeddings" not in train.freeze:
        raise ConfigError("train.freeze lists head, but model.tie_embeddings shares the head "
                          "with the token embedding, which would freeze it too; list "
                          "embeddings as well, or remove head")
    for part in train.freeze:
        if part not in present and part != "head":  # a tied head: checked above
            raise ConfigError(f"train.freeze lists {part}, which this model has no parameters "
                              f"for (it has {present}); remove it")
    if not set(present) - set(train.freeze):
        raise ConfigError(f"train.freeze = {train.freeze} freezes every part of the model; "
                          "nothing would train: leave at least one part out")


def check_activation_checkpointing(train: Any) -> None:
    """``train.activation_checkpointing`` runs eagerly (``train``: a ``TrainConfig``): under
    torch.compile checkpoint's ``context_fn`` must be a dispatch mode, and the marker that
    keeps a recomputed MoE call from counting its loads and aux term twice is not one."""
    if train.activation_checkpointing != "none" and train.compile:
        raise ConfigError(f"train.activation_checkpointing = {train.activation_checkpointing} "
                          "does not combine with train.compile (compiled checkpoint regions "
                          "cannot mark recomputation, which MoE load counting needs); set "
                          "train.compile=false or train.activation_checkpointing=none")


def check_source_fields(i: int, src: Any) -> None:
    """``data.sources[i]`` (a SourceConfig): prompt_field/answer_field come as a pair, and
    only jsonl/parquet read them (and level_field); file sources need a path."""
    if src.type in ("parquet", "jsonl", "text") and not src.path:
        raise ConfigError(f"data.sources[{i}].path is empty for a {src.type} source; "
                          "set it to a file glob")
    if src.min_difficulty > src.max_difficulty:
        raise ConfigError(f"data.sources[{i}].min_difficulty exceeds max_difficulty; swap them")
    fields = {"prompt_field": src.prompt_field, "answer_field": src.answer_field,
              "level_field": src.level_field}
    used = [name for name, value in fields.items() if value]
    if used and src.type not in ANSWER_FIELD_SOURCE_TYPES:
        raise ConfigError(f"data.sources[{i}].{used[0]} is set on a {src.type} source; only "
                          "jsonl and parquet sources read it, remove it")
    if bool(src.prompt_field) != bool(src.answer_field):
        given, missing = (("prompt_field", "answer_field") if src.prompt_field
                          else ("answer_field", "prompt_field"))
        raise ConfigError(f"data.sources[{i}].{given} is set without {missing}; set both "
                          "(the document is prompt + answer) or neither")


def check_tokenizer(tok: Any) -> None:
    """``data.tokenizer`` (a TokenizerConfig): type file reads path; byte and bpe read
    neither a path nor a BOS setting."""
    if tok.type == "file" and not tok.path:
        raise ConfigError("data.tokenizer.path is empty for a file tokenizer; set it to a "
                          "tokenizer.json, a Hugging Face tokenizer directory or a .gguf file")
    if tok.type != "file" and tok.path:
        raise ConfigError(f"data.tokenizer.path is set for a {tok.type} tokenizer; only type "
                          "file reads it: set data.tokenizer.type to file or remove the path")
    if tok.type != "file" and tok.add_bos == "true":
        raise ConfigError(f"data.tokenizer.add_bos = true, but a {tok.type} tokenizer has no BOS "
                          "token; set it to auto or false (or use type file)")
