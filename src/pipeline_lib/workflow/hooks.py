"""The Snakefile's handlers: ``onstart``, ``onsuccess`` and ``onerror`` of the main process.

``onstart`` runs once Snakemake has built its plan of jobs and before the first one starts
(never for a dry run, ``--no-hooks``, or a call with nothing to do); the others when the
jobs are over. Torch-free, like everything the Snakefile imports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError, PipelineError
from ..holders import file_problem
from .results_lock import hold_results_dir, release_results_dir
from .slurm_status import status_command_problem
from .stages.parent_runs import close_open_parents


def start_workflow(workflow: Any, plan: Any) -> None:
    """``onstart``, in this order: under SLURM, a ``sacct`` that cannot report jobs is
    refused (:mod:`.slurm_status`); the results directory is held, or refused when another
    working directory's workflow uses it (:mod:`.results_lock`); every run's
    spec file is written where missing (:mod:`.run_specs`). A problem ends Snakemake with one
    ``error:`` line, before any job, with the lock let go."""
    try:
        status_command_problem(workflow)
        hold_results_dir(workflow, plan)
        try:
            plan.write_run_specs()
        except OSError as exc:
            where = Path(exc.filename2 or exc.filename or ".").absolute()
            raise ConfigError(file_problem(exc, f"write {where}")) from None
    except PipelineError as exc:
        release_results_dir()
        raise SystemExit(f"error: {exc}") from None


def end_workflow(plan: Any, status: str) -> None:
    """``onsuccess`` (``FINISHED``) and ``onerror`` (``FAILED``): the MLflow parent runs a
    stage left open are closed, then the results directory is let go."""
    try:
        close_open_parents(plan, status)
    finally:
        release_results_dir()


__all__ = ["end_workflow", "start_workflow"]
