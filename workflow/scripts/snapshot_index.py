"""Rule snapshot_index: snapshots/index.json of the kept steps and the `final` link."""

from pathlib import Path

from pipeline_lib.checkpoint.index import write_index
from pipeline_lib.workflow.io import script_logging

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    write_index(Path(snakemake.output.index), [Path(p) for p in snakemake.input.kept])
