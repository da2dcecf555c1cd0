"""The training loop's extension points: a no-op by default, replaced from outside.

:class:`StepHooks` names the two points where the loop lets someone else act: before a
global step runs, and on the objective of every micro-batch. The trainer takes whatever
:func:`installed_step_hooks` returns when a segment is built. Nothing in the package installs
hooks; the fault-injection tests do (``tests/support/faults.py``: NaN losses, loss spikes, a
pause to SIGKILL a segment in), so the production loop carries no test-only behaviour.
"""

from __future__ import annotations

from torch import Tensor


class StepHooks:
    """Hook points of the step loop; every method here does nothing."""

    def before_step(self, step: int) -> None:
        """Called before global step ``step`` (1-based, as in metrics.jsonl) runs."""

    def loss(self, loss: Tensor, step: int, flat_row: int) -> Tensor:
        """The objective of one micro-batch of ``step``, whose data starts at row
        ``flat_row`` of the row stream (``epoch · rows_per_epoch + row``); what this returns
        is what the step backpropagates and the spike guard judges."""
        return loss


_installed: StepHooks = StepHooks()


def installed_step_hooks() -> StepHooks:
    """The hooks the next segment built in this process will call."""
    return _installed


def install_step_hooks(hooks: StepHooks | None) -> StepHooks:
    """Use ``hooks`` for segments built from now on (None: the no-op defaults); returns the
    hooks they replace, so a caller can put them back."""
    global _installed
    previous, _installed = _installed, hooks or StepHooks()
    return previous
