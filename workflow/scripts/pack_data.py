"""Rule pack_data: tokenize and pack the corpus of one data config."""

from pathlib import Path

from pipeline_lib.workflow.io import config_job
from pipeline_lib.workflow.stages.data import pack_stage

snakemake = globals()["snakemake"]

with config_job(snakemake, {"data": snakemake.params.data}) as cfg:
    pack_stage(cfg.data, Path(snakemake.output.data_dir))
