"""``train.freeze``: model parts whose parameters stay fixed during training.

A frozen parameter gets ``requires_grad`` off before the optimizer is built, so it gets no
gradient, no optimizer state and no parameter group (:func:`.optim.classify_parameters`
skips it); it keeps its value, the snapshot still stores it and the EMA copies it. The
parts (:data:`~pipeline_lib.spec.rules.FREEZE_PARTS`) name the model's attributes:

- ``embeddings``: ``tok_emb``, ``step_emb`` and ``pos_emb`` (and a head tied to ``tok_emb``);
- ``prelude``, ``core``, ``coda``: every block of that stack (attention, FFN, norms,
  MoE router and experts); a frozen MoE layer's routing bias (a buffer, aux-loss-free
  balancing) is held fixed too, so the part computes what it computed before;
- ``head``: the untied output head; ``norm``: the final norm;
- ``adapter``: the input-injection adapter, ``injection_proj`` (linear injection) and a
  learnable λ (``injection_scale``), and the loop gates of gated recurrence (``loop_gate``).

Which parts a model has, and which lists make sense, is checked with the config
(:func:`pipeline_lib.spec.rules.model_parts`). Changing the list changes the optimizer's
parameter groups, so resuming across a change is refused (``train.freeze`` is a
resume-compatibility key); a warm start may change it.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..model.moe import MoEFFN

PART_ATTRIBUTES = {
    "embeddings": ("tok_emb", "step_emb", "pos_emb"),
    "prelude": ("prelude",),
    "core": ("core",),
    "coda": ("coda",),
    "head": ("head",),
    "norm": ("norm",),
    "adapter": ("injection_proj", "injection_scale", "loop_gate"),
}


def _part_members(model: nn.Module, part: str) -> list[nn.Parameter | nn.Module]:
    attrs = PART_ATTRIBUTES[part]
    if part == "head" and getattr(model, "head", None) is None:
        attrs = ("tok_emb",)
    values = [getattr(model, attr, None) for attr in attrs]
    return [v for v in values if isinstance(v, (nn.Parameter, nn.Module))]


def part_parameters(model: nn.Module, part: str) -> list[nn.Parameter]:
    """The parameters of one :data:`PART_ATTRIBUTES` part (none for an absent attribute;
    a head tied to the token embedding is ``tok_emb``)."""
    out: list[nn.Parameter] = []
    for value in _part_members(model, part):
        out.extend([value] if isinstance(value, nn.Parameter) else value.parameters())
    return out


def freeze_parts(model: nn.Module, parts: Sequence[str]) -> int:
    """Turn ``requires_grad`` off for every parameter of ``parts``; returns how many
    parameters (elements) were frozen."""
    frozen = {id(p): p for part in parts for p in part_parameters(model, part)}
    assert all(part_parameters(model, part) for part in parts), \
        f"train.freeze {list(parts)} names a part the model lacks; validate_config checks this"
    for p in frozen.values():
        p.requires_grad_(False)
    modules = [v for part in parts for v in _part_members(model, part)
               if isinstance(v, nn.Module)]
    for moe in (m for v in modules for m in v.modules() if isinstance(m, MoEFFN)):
        moe.bias_update_rate = 0.0  # config-derived: set again by every build
    return sum(p.numel() for p in frozen.values())
