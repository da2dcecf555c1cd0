"""The stage modules: each door imports only what its job needs, so the Snakefile (which
imports the parent-run handler on every call) and the torch-free jobs stay light."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "lm_eval", "mlflow")


@pytest.mark.parametrize("module", ["parent_runs", "heff_summary", "common", "compare"])
def test_light_stage_modules_import_nothing_heavy(module: str) -> None:
    code = (f"import sys, pipeline_lib.workflow.stages.{module}; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "", f"stages.{module} imports {done.stdout}"


def test_the_stages_package_imports_no_stage() -> None:
    code = ("import sys, pipeline_lib.workflow.stages; "
            "print(sorted(m for m in sys.modules if m.startswith('pipeline_lib.workflow.stages.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
