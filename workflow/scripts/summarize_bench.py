"""Rule summarize_bench: long table and accuracy heatmaps over the benchmarked snapshots."""

from pathlib import Path

from pipeline_lib.workflow.io import run_job
from pipeline_lib.workflow.stages.bench import summarize_bench_stage

snakemake = globals()["snakemake"]

with run_job(snakemake) as cfg:
    summarize_bench_stage(cfg, snakemake.params.run,
                          Path(snakemake.params.run_dir),
                          [Path(p) for p in snakemake.input.results],
                          Path(snakemake.output.table), Path(snakemake.output.plot))
