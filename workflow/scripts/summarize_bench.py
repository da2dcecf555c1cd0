"""Rule summarize_bench: long table and accuracy heatmaps over the benchmarked snapshots."""

from pathlib import Path

from pipeline_lib.stages import summarize_bench_stage
from pipeline_lib.workflow_io import run_config, script_logging

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    run = snakemake.params.run
    table = Path(snakemake.output.table)
    summarize_bench_stage(run_config(snakemake), run, table.parent.parent,
                          [Path(p) for p in snakemake.input.results], table,
                          Path(snakemake.output.plot))
