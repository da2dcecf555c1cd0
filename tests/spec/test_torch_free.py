"""Every module of :mod:`pipeline_lib.spec` imports without torch, mlflow, lm-eval or omegaconf.

The spec floor is what the Snakefile imports on every call, dry runs included (DESIGN.md:
heavy imports stay in the stage code); one heavy import anywhere in it costs every call
seconds. Each module is imported in a fresh interpreter, so one cannot hide behind another.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import pipeline_lib.spec

# omegaconf too: it costs as much again as spec.config itself, and only loading a config needs it
HEAVY = ("torch", "mlflow", "lm_eval", "transformers", "tokenizers", "omegaconf")
MODULES = sorted(m.name for m in pkgutil.iter_modules(pipeline_lib.spec.__path__))


def test_the_spec_package_has_its_modules():
    assert {"config", "layout", "signatures", "snapshots", "budget", "size"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_nothing_heavy(module: str):
    code = (f"import sys, pipeline_lib.spec.{module}; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "", f"pipeline_lib.spec.{module} imports {done.stdout}"
