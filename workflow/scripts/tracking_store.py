"""Rule tracking_store: create the MLflow store schema and experiment once (local rule)."""

from pathlib import Path

from pipeline_lib.workflow.io import config_job
from pipeline_lib.workflow.stages.parent_runs import prepare_tracking_store

snakemake = globals()["snakemake"]

with config_job(snakemake, snakemake.config) as cfg:
    prepare_tracking_store(cfg, Path(snakemake.output.marker))
