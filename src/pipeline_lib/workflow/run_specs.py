"""The specs of one Snakemake call: each run's completed config, written under its digest
before the first job and named in every job's params (:mod:`pipeline_lib.spec.run_spec`).

A cluster job runs Snakemake again (``--mode remote``), whose Snakefile plans again. So that
this plan has the very specs of the call that submitted the job, without resolving them again
(no pretrained source's headers, no tokenizer file read in every job), the main call exports
each run's digest in :data:`SPECS_ENV` (:func:`export_digests`): SLURM hands the submitting
process's environment to the job (the executor plugin's ``sbatch --export=ALL``), and
registering the variable makes Snakemake pass it to executors that pass only what a
workflow declares. The job's plan reads those files (:func:`planned_digests`). Without the
variable it resolves the run again; its job then reads the spec of that digest, which must be
one a main call wrote, or it stops in one line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..spec.run_spec import DIGEST_CHARS, RunSpec, write_run_spec

SPECS_ENV = "LOOPLINE_RUN_SPECS"  # "run=digest,run=digest": the specs a call's jobs read
_ENTRY = re.compile(rf"^(?P<run>[A-Za-z_][A-Za-z0-9_]*)=(?P<digest>[0-9a-f]{{{DIGEST_CHARS}}})$")


def encode_digests(digests: Mapping[str, str]) -> str:
    """``{run: digest}`` as the value of :data:`SPECS_ENV`."""
    return ",".join(f"{run}={digest}" for run, digest in digests.items())


def planned_digests(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``{run: digest}`` the main call exported (:data:`SPECS_ENV`; {} when unset).
    ConfigError (one line) when the variable is not one that call wrote."""
    value = (os.environ if environ is None else environ).get(SPECS_ENV, "")
    digests = {}
    for entry in filter(None, value.split(",")):
        match = _ENTRY.match(entry)
        if match is None:
            raise ConfigError(f"environment variable {SPECS_ENV} = {value!r}: {entry!r} is not "
                              f"run=digest ({DIGEST_CHARS} hex digits); leave the variable to "
                              "the Snakemake call that sets it (unset it in your shell)")
        digests[match["run"]] = match["digest"]
    return digests


def export_digests(workflow: Any, digests: Mapping[str, str]) -> None:
    """In the main Snakemake call: put the runs' digests in :data:`SPECS_ENV`, inherited by
    the jobs it submits, and declare it to Snakemake (``workflow.register_envvars``), which
    passes it to executors that do not hand down the whole environment."""
    os.environ[SPECS_ENV] = encode_digests(digests)
    workflow.register_envvars(SPECS_ENV)


def write_run_specs(specs: Iterable[tuple[RunSpec, str | Path]]) -> list[str]:
    """Write each (spec, run directory) as ``{run_dir}/specs/{digest}.yaml`` unless that file
    holds it already; returns the run directories written."""
    return [str(run_dir) for spec, run_dir in specs if write_run_spec(spec, run_dir)]


__all__ = ["SPECS_ENV", "encode_digests", "export_digests", "planned_digests",
           "write_run_specs"]
