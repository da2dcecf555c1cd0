"""Activation checkpointing of a looped model (``train.activation_checkpointing``).

- ``none``: backward uses the activations every op saved in the forward pass.
- ``loop``: each loop (injection + core blocks) keeps only its input and recomputes the rest
  in backward; so do the prelude (one piece) and every readout's coda + final norm.
- ``block``: the same, block by block (every prelude, core and coda block alone).

Non-reentrant :func:`torch.utils.checkpoint.checkpoint` (``use_reentrant=False``): the
autograd graph is that of an uncheckpointed pass and only the tensors it saved are
recomputed, so gradients are bit-identical to ``none`` wherever the forward is
deterministic. Nothing in the model draws random numbers (no dropout), so there is no RNG
state to replay. Passes without gradients (truncated backprop's free loops, evaluation,
generation) are never checkpointed. ``train.compile`` is refused with it (config rules):
under torch.compile a ``context_fn`` must be a dispatch mode, so the marker below cannot run.

A forward pass has side effects that must happen once per pass: MoE layers count expert
loads (for the aux-loss-free bias update) and record aux-loss terms. The recomputation runs
under :func:`recomputing` true (checkpoint's ``context_fn``), and ``MoEFFN`` records nothing
then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, TypeVar

import torch
from torch.utils.checkpoint import checkpoint

T = TypeVar("T")
_state = threading.local()  # backward may recompute on an autograd worker thread


def recomputing() -> bool:
    """Whether this thread is recomputing a checkpointed piece in backward."""
    return getattr(_state, "depth", 0) > 0


class _Recomputation:
    """Marks this thread as recomputing while entered. Re-enterable: checkpoint enters its
    context once per recomputation, and a piece may be recomputed more than once, which a
    ``contextlib.contextmanager`` object refuses."""

    def __enter__(self) -> None:
        _state.depth = getattr(_state, "depth", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _state.depth -= 1


_RECOMPUTATION = _Recomputation()


def _contexts() -> tuple[Any, Any]:
    """(around the forward, around its recomputation): only the latter is marked."""
    return nullcontext(), _RECOMPUTATION


def checkpointed(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` whose saved activations are recomputed in backward; a plain call when
    gradients are off (nothing would be saved)."""
    if not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False, context_fn=_contexts)
