"""A run's model section from a pretrained source (``model.init_from``), headers only:
completed for the planner (:func:`resolve_init_from`), or the source as it is
(:func:`original_config`). Torch-free: the tensors are read by :mod:`pipeline_lib.retrofit`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..data.tokenizer_files import source_vocab_size
from ..errors import ConfigError
from ..spec.config import Config
from ..spec.init_source import fingerprint_id
from ..spec.names import CONFIG_JSON
from .hf_layout import LayerChoice, init_choice, model_fields
from .pretrained_source import PretrainedSource, read_source


def init_model_config(cfg: Config, source: PretrainedSource, choice: LayerChoice,
                      adapter: str | None = None) -> Config:
    """``cfg`` with the model keys the source fixes (:func:`.hf_layout.model_fields`), the
    layer counts of ``choice`` and ``adapter`` as the injection; other model keys (loops,
    λ, state_init, step embedding, kernels) stay ``cfg``'s. Rows longer than a Mistral's
    sliding window are refused: loopline's attention has no window, so past it the logits
    would differ from the source's (the one check for the planner and ``import-hf`` alike)."""
    window = source.arch.sliding_window
    if window and cfg.data.seq_len > window:
        raise ConfigError(f"data.seq_len = {cfg.data.seq_len} exceeds the sliding window of "
                          f"{source.path / CONFIG_JSON} (sliding_window = {window}), which "
                          f"loopline's attention does not have; use data.seq_len <= {window} "
                          "(import-hf: pass data.seq_len=N as an override)")
    fields = model_fields(source.arch, choice)
    if adapter is not None:
        fields["injection"] = adapter
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **fields))


def resolve_init_from(cfg: Config) -> tuple[Config, dict[str, Any]]:
    """``cfg`` with its model section completed from ``model.init_from.source``, and what the
    source resolved to (``RunSpec.init``: fingerprint, architecture, layers); unchanged and
    ``{}`` without one. The layer ranges and the tokenizer are checked against the source,
    whose headers are read once."""
    init = cfg.model.init_from
    if not init.source:
        return cfg, {}
    source = read_source(init.source)
    arch, tok = source.arch, cfg.data.tokenizer
    choice = init_choice(init, arch.layers)
    if tok.type != "file":
        raise ConfigError(f"model.init_from.source = {init.source!r} brings its own tokenizer, "
                          f"but data.tokenizer.type is {tok.type!r}; set data.tokenizer: "
                          f"{{type: file, path: {init.source}}} (a {tok.type} tokenizer does "
                          "not match the pretrained embedding)")
    vocab = source_vocab_size(tok.path)
    if vocab > arch.vocab_size:
        raise ConfigError(f"data.tokenizer.path = {tok.path!r} has {vocab} ids, but the model "
                          f"of model.init_from.source has {arch.vocab_size} embedding rows; use "
                          "the source's own tokenizer (data.tokenizer.path = the source)")
    return init_model_config(cfg, source, choice, init.adapter), {
        "fingerprint": fingerprint_id(init.source), "architecture": arch.architecture,
        "layers": choice.as_lists()}


def original_config(cfg: Config, source: PretrainedSource) -> Config:
    """The source as it is: every layer, one loop, the plain additive path from zero (the
    retrofit planner's reference and ``train.distill.teacher = source``)."""
    model = dataclasses.replace(cfg.model, loops=1, state_init="zeros", recurrence="plain",
                                injection="add", injection_scale=1.0, step_embedding=False)
    cfg = dataclasses.replace(cfg, model=model)
    return init_model_config(cfg, source, LayerChoice.whole(source.arch.layers))


__all__ = ["init_model_config", "original_config", "resolve_init_from"]
