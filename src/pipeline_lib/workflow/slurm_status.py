"""Before the first job is submitted: can Snakemake's SLURM executor see jobs end here?

The executor polls ``sacct`` by default. On a cluster without accounting storage (no
slurmdbd: many small clusters) ``sacct`` only answers "Slurm accounting storage is
disabled"; the plugin logs that at debug level and keeps polling, so no job is ever seen to
finish and Snakemake waits for ever. The Snakefile's ``onstart``
(:func:`~pipeline_lib.workflow.hooks.start_workflow`) calls :func:`status_command_problem`,
which turns that into one line naming the fix: the executor's
``squeue`` status command (``--slurm-status-command squeue``, or ``slurm-status-command:
squeue`` in the profile), which sees finished jobs for ``MinJobAge`` seconds.
"""

from __future__ import annotations

import subprocess
from typing import Any

from ..errors import ConfigError


def sacct_problem() -> str | None:
    """What ``sacct`` says when it cannot report jobs (accounting disabled, no daemon), or
    None when it works."""
    try:
        out = subprocess.run(["sacct", "-X", "-n", "-j", "1", "-o", "JobID"],
                             capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return "sacct is not installed"
    except subprocess.TimeoutExpired:
        return "sacct did not answer within 60 s"
    if out.returncode == 0:
        return None
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[-1] if lines else f"sacct exited with status {out.returncode}"


def status_command_problem(workflow: Any) -> None:
    """Under the SLURM executor with its ``sacct`` status command: a ``sacct`` that cannot
    report jobs is a :class:`ConfigError` naming the ``squeue`` alternative."""
    plugin = getattr(workflow, "executor_plugin", None)
    if plugin is None or getattr(plugin, "name", None) != "slurm":
        return
    command = getattr(workflow.executor_settings, "status_command", "sacct")
    if command != "sacct":
        return
    problem = sacct_problem()
    if problem is not None:
        raise ConfigError(
            f"Snakemake's SLURM executor watches jobs with sacct, which fails here "
            f"({problem}): no job would ever be seen to finish. Run with "
            "--slurm-status-command squeue (or add `slurm-status-command: squeue` to your "
            "profile); squeue sees a finished job for MinJobAge seconds (scontrol show config "
            "| grep MinJobAge), which must be at least 120")
