"""Rule tracking_store: create the MLflow store schema and experiment once (local rule)."""

from pathlib import Path

from pipeline_lib.spec.config_load import config_from_dict
from pipeline_lib.workflow.io import script_logging
from pipeline_lib.workflow.stages.parent_runs import prepare_tracking_store

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    prepare_tracking_store(config_from_dict(snakemake.config), Path(snakemake.output.marker))
