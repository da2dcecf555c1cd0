"""Rule pack_data: tokenize and pack the corpus of one data config."""

from pathlib import Path

from pipeline_lib.spec.config_load import config_from_dict
from pipeline_lib.workflow.io import script_logging
from pipeline_lib.workflow.stages.data import pack_stage

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    pack_stage(config_from_dict({"data": snakemake.params.data}).data,
               Path(snakemake.output.data_dir))
