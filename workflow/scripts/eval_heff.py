"""Rule eval_heff: validation loss of one kept snapshot at every eval.h_eff, one pass."""

from pathlib import Path

from pipeline_lib.workflow.io import run_job
from pipeline_lib.workflow.stages.heff import heff_stage

snakemake = globals()["snakemake"]

with run_job(snakemake, snakemake.threads) as cfg:
    heff_stage(cfg, Path(snakemake.params.run_dir),
               Path(snakemake.input.snapshot), Path(snakemake.input.data),
               Path(snakemake.output.result))
