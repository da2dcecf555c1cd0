"""The teacher of ``train.distill``: loaded once per segment job, run without gradients.

``teacher: source`` is the pretrained model of ``model.init_from.source`` as it is (every
layer, one loop: the original), built by the caller's ``build_source`` (the import code of
:mod:`pipeline_lib.retrofit.hf_import`, a sibling of this package, handed in by the train
command and the workflow's rule); a path is a loopline snapshot, run at its own
``model.loops``. Either must read the pack's tokenizer (a snapshot's ``tokenizer.json`` is
compared with the pack's by identity; a source's is checked when the config is completed,
see :func:`~pipeline_lib.pretrained.init.resolve_init_from`) and have the student's number
of output rows. Building the teacher draws no random numbers from the training streams
(the global RNG is forked around it), so exact resume is unchanged by it.

:meth:`Teacher.target` runs one micro-batch through the teacher in eval mode under
``no_grad`` and returns the :class:`~pipeline_lib.model.distill.DistillTarget` the
student's readouts are scored against (the teacher's final hidden states and head: the
[N, V] logits are formed chunk by chunk inside the loss, never whole).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import Tensor

from ..checkpoint.compat import check_snapshot_fits_pack
from ..data.loader import PackedData
from ..errors import ConfigError
from ..evaluate.loading import load_for_eval
from ..model.distill import DistillTarget
from ..model.looped import LoopedLM
from ..spec.config import Config

log = logging.getLogger(__name__)

KEY = "train.distill.teacher"
SourceBuilder = Callable[[Config], LoopedLM]  # the whole pretrained model of init_from.source


class Teacher:
    """A frozen model whose readout after ``loops`` loops the student is distilled toward."""

    def __init__(self, model: LoopedLM, loops: int, weight: float) -> None:
        self.model, self.loops = model.eval().requires_grad_(False), loops
        self.weight = weight

    @torch.no_grad()
    def target(self, batch: Mapping[str, Tensor]) -> DistillTarget:
        """The teacher's readout of ``batch`` (already on the device)."""
        ctx = self.model.embed(batch)
        hidden = self.model.readout_hidden(self.model.forward_loops(ctx, 0, self.loops), ctx)
        self.model.take_aux_loss()  # an MoE teacher's aux terms are not the student's
        return DistillTarget(hidden.reshape(-1, hidden.shape[-1]), self.model.head_weight,
                             self.weight)


def _snapshot_teacher(path: Path, data: PackedData, device: torch.device) -> LoopedLM:
    if not path.is_dir():
        raise ConfigError(f"{KEY} = {str(path)!r} is not a snapshot directory; use source, a "
                          "loopline snapshot, or '' (off)")
    check_snapshot_fits_pack(path, data, use=f"distillation ({KEY})",
                             fix=f"set {KEY} to a snapshot trained with this pack's tokenizer")
    return load_for_eval(path, with_tokenizer=False, device=device).model


def load_teacher(cfg: Config, data: PackedData, device: torch.device,
                 build_source: SourceBuilder | None) -> Teacher | None:
    """The teacher ``cfg.train.distill`` names (None when off), on ``device``; one-line
    ConfigErrors naming ``train.distill.teacher`` for a teacher that cannot be used."""
    distill = cfg.train.distill
    if not distill.teacher:
        return None
    with torch.random.fork_rng(devices=[]):  # no draw from the training's RNG streams
        if distill.teacher == "source":
            if build_source is None:
                raise ConfigError(f"{KEY} = source needs the import code, which this caller "
                                  "did not pass; run the segment with `python -m pipeline_lib "
                                  "train` or the workflow")
            model, loops = build_source(cfg), 1
        else:
            model = _snapshot_teacher(Path(distill.teacher).expanduser(), data, device)
            loops = model.cfg.loops
    model = model.to(device)
    rows, own = model.cfg.vocab_size, cfg.model.vocab_size
    if rows != own:
        raise ConfigError(f"{KEY} = {distill.teacher!r}: the teacher has {rows} output rows, "
                          f"the student {own}; a teacher must share the student's tokenizer "
                          "and vocabulary")
    log.info("distilling from %s (%d loops, weight %g)", distill.teacher, loops, distill.weight)
    return Teacher(model, loops, distill.weight)


__all__ = ["SourceBuilder", "Teacher", "load_teacher"]
