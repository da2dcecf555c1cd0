"""Rule summarize_heff: parquet tables and plots over every kept snapshot's sweep."""

from pathlib import Path

from pipeline_lib.workflow.io import run_job
from pipeline_lib.workflow.stages.heff_summary import summarize_heff_stage

snakemake = globals()["snakemake"]

with run_job(snakemake) as cfg:
    summarize_heff_stage(cfg, snakemake.params.run,
                         Path(snakemake.params.run_dir),
                         [Path(p) for p in snakemake.input.results],
                         Path(snakemake.output.table), Path(snakemake.output.plot),
                         Path(snakemake.output.adaptive_table),
                         Path(snakemake.output.adaptive_plot),
                         Path(snakemake.output.label_table),
                         Path(snakemake.output.label_plot))
