"""Fault injection for tests: NaN losses, loss spikes, pauses to SIGKILL a segment in.

Production code carries none of this. The trainer exposes :class:`StepHooks`
(:mod:`pipeline_lib.train.hooks`) and the snapshot writer a file hook
(:mod:`pipeline_lib.checkpoint.write_hooks`); a :class:`FaultPlan` is installed there from
outside: in-process by the ``inject_faults`` fixture (``tests/train/conftest.py``), in a
subprocess by the entry ``tests/support/faulty_train.py``, which reads two test-only
environment variables (production modules never read them):

``LOOPLINE_FAULT_INJECT``: comma-separated ``key=value`` items:

- ``nan_step=S``: the loss of global step S (1-based, as in metrics.jsonl) is multiplied
  by NaN (NaN loss and NaN gradients); with ``nan_rank=R`` only on rank R of a
  multi-process run (the other ranks see finite values: the ranks must still agree);
- ``spike_rows=A:B`` (+ ``spike_nats=X``, default 50): while the step's data cursor, as a
  flat row index ``epoch·rows_per_epoch + row``, lies in ``[A, B)``, X nats are added to the
  loss. The gradient is unchanged (only the spike guard notices), and since the spikes are
  tied to data, a rollback that skips that data really avoids them;
- ``pause_step=S`` or ``pause_step=A:B`` (+ ``pause_s=T``, default 60; ``pause_file=PATH``):
  before step S (each step A..B) runs, touch PATH (so a test knows the moment) and sleep T
  seconds, a window to SIGKILL the process in the middle of the step loop, or a segment
  that outlasts a SLURM time limit without computing more.

``LOOPLINE_TEST_SNAPSHOT_PAUSE_S=T``: the snapshot writer sleeps T seconds after each file
it reports, a window to SIGKILL it in the middle of a snapshot write.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline_lib.checkpoint.write_hooks import add_file_hook
from pipeline_lib.errors import ConfigError
from pipeline_lib.train.hooks import StepHooks, install_step_hooks

log = logging.getLogger(__name__)

FAULT_ENV = "LOOPLINE_FAULT_INJECT"
SNAPSHOT_PAUSE_ENV = "LOOPLINE_TEST_SNAPSHOT_PAUSE_S"
FAULTY_TRAIN = Path(__file__).with_name("faulty_train.py")
_KEYS = {"nan_step", "nan_rank", "spike_rows", "spike_nats", "pause_step", "pause_s",
         "pause_file"}


@dataclass(frozen=True)
class FaultPlan(StepHooks):
    """Parsed ``LOOPLINE_FAULT_INJECT``, usable as the trainer's step hooks; the default
    instance injects nothing."""

    nan_step: int | None = None
    spike_rows: tuple[int, int] | None = None
    spike_nats: float = 50.0
    pause_step: tuple[int, int] | None = None  # first and last step that pause
    pause_s: float = 60.0
    pause_file: Path | None = None
    nan_rank: int | None = None
    rank: int = 0  # this process's rank (torchrun's RANK)

    @property
    def active(self) -> bool:
        return (self.nan_step is not None or self.spike_rows is not None
                or self.pause_step is not None)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FaultPlan:
        environ = os.environ if environ is None else environ
        text = environ.get(FAULT_ENV, "").strip()
        if not text:
            return cls()
        items: dict[str, str] = {}
        for part in text.split(","):
            key, sep, value = part.strip().partition("=")
            if not sep or key not in _KEYS:
                raise ConfigError(f"{FAULT_ENV} item {part!r} is not key=value with a key in "
                                  f"{sorted(_KEYS)}; fix or unset the variable")
            items[key] = value
        try:
            spike = None
            if "spike_rows" in items:
                lo, _, hi = items["spike_rows"].partition(":")
                spike = (int(lo), int(hi))
            plan = cls(
                nan_step=int(items["nan_step"]) if "nan_step" in items else None,
                spike_rows=spike,
                spike_nats=float(items.get("spike_nats", 50.0)),
                pause_step=_step_range(items["pause_step"]) if "pause_step" in items else None,
                pause_s=float(items.get("pause_s", 60.0)),
                pause_file=Path(items["pause_file"]) if "pause_file" in items else None,
                nan_rank=int(items["nan_rank"]) if "nan_rank" in items else None,
                rank=int(environ.get("RANK", "0")),
            )
        except ValueError:
            raise ConfigError(f"{FAULT_ENV}={text!r} has a non-numeric value; e.g. "
                              "nan_step=5,spike_rows=64:128,pause_step=7") from None
        log.warning("fault injection active (%s=%s): for tests only", FAULT_ENV, text)
        return plan

    def perturb_loss(self, loss: Any, step: int, flat_row: int) -> Any:
        """The loss (a tensor) of global ``step`` whose data starts at ``flat_row``, perturbed
        as asked: ``loss · NaN`` (NaN loss and NaN gradients) or ``loss + spike_nats``."""
        if (self.nan_step is not None and step == self.nan_step
                and self.nan_rank in (None, self.rank)):
            log.warning("fault injection: NaN loss at step %d (rank %d)", step, self.rank)
            return loss * math.nan
        if self.spike_rows is not None and self.spike_rows[0] <= flat_row < self.spike_rows[1]:
            log.warning("fault injection: +%g nats at step %d (row %d)", self.spike_nats, step,
                        flat_row)
            return loss + self.spike_nats
        return loss

    def maybe_pause(self, step: int) -> None:
        """Sleep before ``step`` when asked (a window to kill the process mid-loop)."""
        if self.pause_step is None or not self.pause_step[0] <= step <= self.pause_step[1]:
            return
        log.warning("fault injection: pausing %.0f s before step %d", self.pause_s, step)
        if self.pause_file is not None:
            self.pause_file.parent.mkdir(parents=True, exist_ok=True)
            self.pause_file.write_text(f"{step}\n")
        time.sleep(self.pause_s)

    # StepHooks
    def loss(self, loss: Any, step: int, flat_row: int) -> Any:
        return self.perturb_loss(loss, step, flat_row)

    def before_step(self, step: int) -> None:
        self.maybe_pause(step)


def _step_range(text: str) -> tuple[int, int]:
    """``S`` → (S, S); ``A:B`` → (A, B)."""
    first, _, last = text.partition(":")
    return int(first), int(last or first)


def snapshot_pause(seconds: float) -> Callable[[Path], None]:
    """A snapshot-writer file hook that sleeps ``seconds`` after each file it hears of."""

    def pause(path: Path) -> None:
        log.warning("test hook: pausing %s s after writing %s", seconds, path.name)
        time.sleep(seconds)

    return pause


def install_from_env(environ: Mapping[str, str] | None = None) -> None:
    """Install what ``LOOPLINE_FAULT_INJECT`` and ``LOOPLINE_TEST_SNAPSHOT_PAUSE_S`` ask for
    in this process (for the lifetime of the process: the entry of a subprocess)."""
    environ = os.environ if environ is None else environ
    plan = FaultPlan.from_env(environ)
    if plan.active:
        install_step_hooks(plan)
    if environ.get(SNAPSHOT_PAUSE_ENV):
        add_file_hook(snapshot_pause(float(environ[SNAPSHOT_PAUSE_ENV])))


def faulty_torchrun_command(original: Callable[..., list[str]]) -> Callable[..., list[str]]:
    """Wrap :func:`pipeline_lib.train.launch.torchrun_command` so that the workers run
    ``faulty_train.py`` (which installs the faults named in their environment) instead of
    ``-m pipeline_lib``."""

    def command(*args: Any, **kwargs: Any) -> list[str]:
        cmd = original(*args, **kwargs)
        i = cmd.index("pipeline_lib")
        assert cmd[i - 1] == "-m", cmd
        return [*cmd[:i - 1], str(FAULTY_TRAIN), *cmd[i + 1:]]

    return command
