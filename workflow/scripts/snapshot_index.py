"""Rule snapshot_index: snapshots/index.json of the kept steps and the `final` link."""

from pathlib import Path

from pipeline_lib.workflow.io import script_logging
from pipeline_lib.workflow.stages.data import index_stage

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    index_stage(Path(snakemake.output.index), [Path(p) for p in snakemake.input.kept])
