"""``resolve_run(config, run) -> RunSpec``: the one place a run's config is completed.

Everything that completes a run's config happens here, in this order: the ``runs:``
variant merged over the other sections (:func:`~pipeline_lib.spec.config_load.config_for_run`), the
model section taken from ``model.init_from.source`` (its headers only:
:func:`~pipeline_lib.pretrained.init.resolve_init_from`), the exit-gate rule that needs
both, the vocabulary the plan counts with, ``train.total_steps`` (the token budget decided),
and the data pack's id. The workflow's plan resolves each run once per Snakemake call and
writes the result to ``{run}/specs/{digest}.yaml`` (:func:`~pipeline_lib.workflow.run_specs.
write_run_specs`, before the first job); the jobs read the file their params name, the
``train`` command resolves through here too, and the trainer takes the completed config as
it is.

It lives on the workflow floor, not in :mod:`pipeline_lib.spec`, because two of its steps
read files through torch-free readers of the mechanics floor (a pretrained source's headers,
a tokenizer file's size), above the spec floor.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..checkpoint.compat import snapshot_config
from ..data.tokenizer_files import source_vocab_size
from ..errors import ConfigError, PipelineError
from ..pretrained.init import resolve_init_from
from ..spec.budget import total_steps
from ..spec.config import Config, DataConfig
from ..spec.config_load import config_for_run
from ..spec.data_id import data_id as compute_data_id
from ..spec.names import BYTE_VOCAB_SIZE
from ..spec.rules import check_exit_gate_trained
from ..spec.run_spec import RunSpec

DEFAULT_RUN = "default"


def check_teacher_vocab(cfg: Config) -> None:
    """A snapshot teacher (``train.distill.teacher``) has the run's vocabulary, unless that is
    known only once packed (BPE); the tokenizers are compared when a segment starts."""
    teacher = cfg.train.distill.teacher
    if teacher in ("", "source") or (not cfg.model.vocab_size and cfg.data.tokenizer.type == "bpe"):
        return
    key = f"train.distill.teacher = {teacher!r}"
    rows = snapshot_config(Path(teacher).expanduser(), fix=f"{key} must be a finished "
                           "snapshot").model.vocab_size
    own = cfg.model.vocab_size or planned_vocab_size(cfg.data)
    if rows != own:
        raise ConfigError(f"{key}: the teacher has a {rows}-token vocabulary, this run "
                          f"{own}; distill from a model of the run's tokenizer")


def planned_vocab_size(data: DataConfig) -> int:
    """Vocabulary size known before packing (for a token-budget step count): 258 for byte,
    the target size for BPE, and a file tokenizer's own, read cheaply (a JSON parse of its
    tokenizer.json, or the GGUF metadata's token count; no tokenizers, torch, transformers)."""
    if data.tokenizer.type == "file":
        return source_vocab_size(data.tokenizer.path)
    return BYTE_VOCAB_SIZE if data.tokenizer.type == "byte" else data.tokenizer.vocab_size


def resolve_run(config: Config, run: str | None = None) -> RunSpec:
    """The completed config of variant ``run`` (``runs.{run}`` merged over the other
    sections), or of the base sections when ``run`` is None (named :data:`DEFAULT_RUN`):
    see the module docstring. A user error names the variant."""
    cfg = config if run is None else config_for_run(config, run)
    try:
        cfg, init = resolve_init_from(cfg)
        check_exit_gate_trained(cfg.train, cfg.model)
        check_teacher_vocab(cfg)
    except PipelineError as exc:
        raise type(exc)(str(exc) if run is None else f"runs.{run}: {exc}") from None
    # the tokenizer's size only matters for a token budget (and may mean reading a file);
    # otherwise the pack decides it (0 here)
    budget = cfg.train.total_steps == 0 and cfg.model.vocab_size == 0
    vocab = cfg.model.vocab_size or (planned_vocab_size(cfg.data) if budget else 0)
    steps = total_steps(cfg.train, cfg.model, cfg.data.seq_len, vocab)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, total_steps=steps))
    return RunSpec(name=run or DEFAULT_RUN, config=cfg, data_id=compute_data_id(cfg.data),
                   vocab_size=vocab, init=init)


def snapshot_run(cfg: Config, run: str | None = None) -> RunSpec:
    """The spec of a config completed already (a snapshot's ``config.yaml``): nothing is
    resolved again (its source may be gone; its total and vocabulary are filled in)."""
    return RunSpec(name=run or DEFAULT_RUN, config=cfg, data_id=compute_data_id(cfg.data),
                   vocab_size=cfg.model.vocab_size)


__all__ = ["DEFAULT_RUN", "planned_vocab_size", "resolve_run", "snapshot_run"]
