"""Rule summarize_heff: parquet tables and plots over every kept snapshot's sweep."""

from pathlib import Path

from pipeline_lib.stages import summarize_heff_stage
from pipeline_lib.workflow_io import run_config, script_logging

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    run = snakemake.params.run
    table = Path(snakemake.output.table)
    summarize_heff_stage(run_config(snakemake), run, table.parent.parent,
                         [Path(p) for p in snakemake.input.results], table,
                         Path(snakemake.output.plot), Path(snakemake.output.adaptive_table),
                         Path(snakemake.output.adaptive_plot))
