"""Fixture: fault injection installed from outside the trainer (see tests/support/faults.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from support.faults import FAULT_ENV, FaultPlan, faulty_torchrun_command

from pipeline_lib.train import launch
from pipeline_lib.train.hooks import install_step_hooks, installed_step_hooks


@pytest.fixture
def inject_faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], FaultPlan]]:
    """``inject_faults("nan_step=3")``: that plan (``LOOPLINE_FAULT_INJECT`` syntax) becomes
    the step hooks of segments trained in this process, and torchrun workers started by
    ``run_training_job`` go through ``faulty_train.py``, which installs it from their
    environment. A later call replaces the plan; the test's end removes it."""
    previous, original = installed_step_hooks(), launch.torchrun_command

    def inject(text: str) -> FaultPlan:
        monkeypatch.setenv(FAULT_ENV, text)
        monkeypatch.setattr(launch, "torchrun_command", faulty_torchrun_command(original))
        plan = FaultPlan.from_env()
        install_step_hooks(plan)
        return plan

    yield inject
    install_step_hooks(previous)
