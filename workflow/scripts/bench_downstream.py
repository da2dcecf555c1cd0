"""Rule bench_downstream: lm-eval tasks on one snapshot at every bench.h_eff."""

from pathlib import Path

from pipeline_lib.workflow.io import run_config, script_logging
from pipeline_lib.workflow.stages import bench_stage

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0], snakemake.threads):
    bench_stage(run_config(snakemake), Path(snakemake.params.run_dir),
                Path(snakemake.input.snapshot), Path(snakemake.output.result),
                Path(snakemake.output.tasks))
