"""Rule pack_data: tokenize and pack the corpus of one data config."""

from pathlib import Path

from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.spec.config import DataConfig, config_from_dict
from pipeline_lib.workflow.io import script_logging

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    data: DataConfig = config_from_dict({"data": snakemake.params.data}).data
    pack_corpus(data, Path(snakemake.output.data_dir))
