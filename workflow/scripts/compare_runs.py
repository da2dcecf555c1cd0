"""Rule compare_runs: table, markdown summary, depth check and plots over every variant."""

from pathlib import Path

from pipeline_lib.workflow.io import script_logging
from pipeline_lib.workflow.stages.compare import compare_stage

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    compare_stage({run: {"heff": Path(snakemake.input[f"{run}_heff"]),
                         "sweep": Path(snakemake.input[f"{run}_sweep"]),
                         "bench": Path(snakemake.input[f"{run}_bench"]),
                         "metrics": Path(snakemake.params.metrics[run])}
                   for run in snakemake.params.runs},
                  Path(snakemake.params.out_dir), Path(snakemake.output.depth))
