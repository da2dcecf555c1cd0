"""Rule track_config: the variant's MLflow parent run brought up to date with its config."""

from pathlib import Path

from pipeline_lib.workflow.io import run_config, script_logging
from pipeline_lib.workflow.stages import update_parent

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    update_parent(run_config(snakemake), snakemake.params.run, Path(snakemake.params.run_dir),
                  snakemake.params.data_id, Path(snakemake.output.parent))
