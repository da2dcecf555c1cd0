"""Rule track_init: the variant's MLflow parent run (tracking.json) and its pack child run."""

from pathlib import Path

from pipeline_lib.workflow.io import run_config, script_logging
from pipeline_lib.workflow.stages import init_tracking

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    init_tracking(run_config(snakemake), snakemake.params.run, Path(snakemake.params.run_dir),
                  Path(snakemake.input.data))
