"""Rule track_config: the variant's MLflow parent run brought up to date with its config."""

from pathlib import Path

from pipeline_lib.workflow.io import run_job
from pipeline_lib.workflow.stages.parent_runs import update_parent

snakemake = globals()["snakemake"]

with run_job(snakemake) as cfg:
    update_parent(cfg, snakemake.params.run, Path(snakemake.params.run_dir),
                  snakemake.params.data_id, Path(snakemake.output.parent))
