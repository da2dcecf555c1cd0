"""Keep a training process that never compiles from importing ``torch._dynamo``.

Importing ``torch._dynamo`` costs about 1.1 s on the reference CPU, a third of a training
segment's fixed cost, and torch's optimizers do it on first use, only to mark code that
dynamo must not trace:

- ``Optimizer.add_param_group``, ``state_dict``, ``load_state_dict`` and ``zero_grad`` are
  wrapped in ``torch._disable_dynamo``, which imports dynamo on its first call to build a
  "do not trace" wrapper and caches it on the function as ``__dynamo_disable``;
- ``Adam.step`` (hence AdamW's) is wrapped in ``_use_grad_for_differentiable``, which
  imports dynamo on every call to place a ``graph_break()`` around the update.

Outside a compiled region neither does anything: the cached wrapper behaves as the plain
function and ``graph_break()`` is a no-op. So, for processes that compile nothing,
:func:`skip_dynamo_import` fills torch's own cache with the plain functions and
:class:`EagerAdamW` runs Adam's update under ``torch.no_grad()`` (what the wrapper does with
``differentiable=False``). The arithmetic is torch's own, bit for bit (tested).

Both only apply to wrappers that are recognisably torch 2.13's; a torch whose internals
differ is left alone (dynamo is then imported, as before, and a test says so). The trainer
uses them only with ``train.compile`` off.
"""

from __future__ import annotations

import inspect
import sys

import torch

OPTIMIZER_METHODS = ("add_param_group", "state_dict", "load_state_dict", "zero_grad")
_DISABLE_WRAPPER = "_disable_dynamo.<locals>.inner"
_CACHE = "__dynamo_disable"


def skip_dynamo_import() -> None:
    """Pre-fill the ``_disable_dynamo`` cache of :data:`OPTIMIZER_METHODS` with the plain
    functions, unless ``torch._dynamo`` is already imported."""
    if "torch._dynamo" in sys.modules:
        return
    for name in OPTIMIZER_METHODS:
        wrapper = getattr(torch.optim.Optimizer, name)
        fn = getattr(wrapper, "__wrapped__", None)
        code = getattr(wrapper, "__code__", None)
        if fn is not None and getattr(code, "co_qualname", "") == _DISABLE_WRAPPER:
            setattr(fn, _CACHE, fn)  # a real cache entry would mean dynamo is imported


def _plain_adam_step():
    """Adam's ``step`` without its dynamo/grad-mode wrappers, or None if torch differs."""
    fn = inspect.unwrap(torch.optim.Adam.step)
    return fn if getattr(fn.__code__, "co_qualname", "") == "Adam.step" else None


_ADAM_STEP = _plain_adam_step()


class EagerAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose ``step`` does not import ``torch._dynamo`` (eager only)."""

    def step(self, closure=None):  # type: ignore[override]
        if _ADAM_STEP is None or self.defaults["differentiable"]:
            return super().step(closure)
        with torch.no_grad():
            return _ADAM_STEP(self, closure)
