"""``resolve_run(config, run) -> RunSpec``: the one place a run's config is completed.

Everything that completes a run's config happens here, in this order: the ``runs:``
variant merged over the other sections (:func:`~pipeline_lib.spec.config_load.config_for_run`), the
model section taken from ``model.init_from.source`` (its headers only:
:func:`~pipeline_lib.pretrained.init.resolve_init_from`), the exit-gate rule that needs
both, ``model.vocab_size`` where the tokenizer fixes it (byte, a file: ``RunSpec.vocab_size``;
a trained BPE's is its pack's, in metadata.json, read when a segment starts),
``train.total_steps`` (the token budget decided) and the data pack's id. The workflow's plan resolves each run once per Snakemake call and
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
from ..data.tokenizer_files import fixed_vocab_size
from ..errors import ConfigError, PipelineError
from ..pretrained.init import resolve_init_from
from ..spec.budget import total_steps
from ..spec.config import Config
from ..spec.config_load import config_for_run
from ..spec.data_id import data_id as compute_data_id
from ..spec.rules import check_exit_gate_trained
from ..spec.run_spec import RunSpec

DEFAULT_RUN = "default"


def check_teacher_vocab(cfg: Config) -> None:
    """A snapshot teacher (``train.distill.teacher``) has the run's vocabulary, unless that is
    known only once packed (BPE); the tokenizers are compared when a segment starts."""
    teacher = cfg.train.distill.teacher
    if teacher in ("", "source") or not cfg.model.vocab_size:
        return
    key = f"train.distill.teacher = {teacher!r}"
    rows = snapshot_config(Path(teacher).expanduser(), fix=f"{key} must be a finished "
                           "snapshot").model.vocab_size
    if rows != cfg.model.vocab_size:
        raise ConfigError(f"{key}: the teacher has a {rows}-token vocabulary, this run "
                          f"{cfg.model.vocab_size}; distill from a model of the run's tokenizer")


def resolve_run(config: Config, run: str | None = None) -> RunSpec:
    """The completed config of variant ``run`` (``runs.{run}`` merged over the other
    sections), or of the base sections when ``run`` is None (named :data:`DEFAULT_RUN`):
    see the module docstring. A user error names the variant."""
    cfg = config if run is None else config_for_run(config, run)
    try:
        cfg, init = resolve_init_from(cfg)
        vocab = fixed_vocab_size(cfg)  # 0: a trained BPE's, the pack's metadata.json decides
        if vocab and not cfg.model.vocab_size:
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab))
        check_exit_gate_trained(cfg.train, cfg.model)
        check_teacher_vocab(cfg)
    except PipelineError as exc:
        raise type(exc)(str(exc) if run is None else f"runs.{run}: {exc}") from None
    # a trained BPE's token budget counts with its target size
    steps = total_steps(cfg.train, cfg.model, cfg.data.seq_len, cfg.data.tokenizer.vocab_size)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, total_steps=steps))
    return RunSpec(name=run or DEFAULT_RUN, config=cfg, data_id=compute_data_id(cfg.data),
                   vocab_size=vocab, init=init)


def snapshot_run(cfg: Config, run: str | None = None) -> RunSpec:
    """The spec of a config completed already (a snapshot's ``config.yaml``): nothing is
    resolved again (its source may be gone; its total and vocabulary are filled in)."""
    return RunSpec(name=run or DEFAULT_RUN, config=cfg, data_id=compute_data_id(cfg.data),
                   vocab_size=cfg.model.vocab_size)


__all__ = ["DEFAULT_RUN", "resolve_run", "snapshot_run"]
