"""Rule track_init: the variant's MLflow parent run (tracking.json) and its pack child run."""

from pathlib import Path

from pipeline_lib.workflow.io import run_job
from pipeline_lib.workflow.stages.parent_runs import init_tracking

snakemake = globals()["snakemake"]

with run_job(snakemake) as cfg:
    init_tracking(cfg, snakemake.params.run, Path(snakemake.params.run_dir),
                  Path(snakemake.input.data), Path(snakemake.output.ready))
