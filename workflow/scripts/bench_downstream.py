"""Rule bench_downstream: lm-eval tasks on one snapshot at every bench.h_eff."""

from pathlib import Path

from pipeline_lib.workflow.io import run_job
from pipeline_lib.workflow.stages.bench import bench_stage

snakemake = globals()["snakemake"]

with run_job(snakemake, snakemake.threads) as cfg:
    bench_stage(cfg, Path(snakemake.params.run_dir),
                Path(snakemake.input.snapshot), Path(snakemake.output.result),
                Path(snakemake.output.tasks))
