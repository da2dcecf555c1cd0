"""Rule export: a run's final snapshot in the Hugging Face format (eval.use_ema: its EMA),
logged as an MLflow logged model of the run's train run."""

from pathlib import Path

from pipeline_lib.workflow.io import run_job
from pipeline_lib.workflow.stages.interop import export_stage

snakemake = globals()["snakemake"]

with run_job(snakemake, snakemake.threads) as cfg:
    export_stage(cfg, snakemake.params.run, Path(snakemake.params.run_dir),
                 Path(snakemake.input.snapshot), Path(snakemake.output.export),
                 Path(snakemake.input.data), use_ema=bool(snakemake.params.use_ema))
