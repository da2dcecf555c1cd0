"""Rule eval_heff: validation loss of one kept snapshot at every eval.h_eff, one pass."""

from pathlib import Path

from pipeline_lib.workflow.io import run_config, script_logging
from pipeline_lib.workflow.stages import heff_stage

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0], snakemake.threads):
    heff_stage(run_config(snakemake), Path(snakemake.params.run_dir),
               Path(snakemake.input.snapshot), Path(snakemake.input.data),
               Path(snakemake.output.result))
