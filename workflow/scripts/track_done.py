"""Rule track_done: every target of the run is built; its MLflow parent run is FINISHED."""

from pathlib import Path

from pipeline_lib.workflow.io import run_job
from pipeline_lib.workflow.stages.parent_runs import finish_run

snakemake = globals()["snakemake"]

with run_job(snakemake, opens_parent=False) as cfg:
    finish_run(cfg, Path(snakemake.params.run_dir), Path(snakemake.output.done))
