"""Rule compare_runs: table, markdown summary, depth check and plots over every variant."""

from pathlib import Path

from pipeline_lib.compare import compare_runs
from pipeline_lib.workflow.io import script_logging

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    inputs = {
        run: {
            "heff": Path(snakemake.input[f"{run}_heff"]),
            "sweep": Path(snakemake.input[f"{run}_sweep"]),
            "bench": Path(snakemake.input[f"{run}_bench"]),
            "metrics": Path(snakemake.params.metrics[run]),
        }
        for run in snakemake.params.runs
    }
    compare_runs(inputs, Path(snakemake.params.out_dir), depth_json=Path(snakemake.output.depth))
