"""Rule track_done: every target of the run is built; its MLflow parent run is FINISHED."""

from pathlib import Path

from pipeline_lib.workflow.io import run_config, script_logging
from pipeline_lib.workflow.stages.parent_runs import finish_run

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    finish_run(run_config(snakemake), Path(snakemake.params.run_dir), Path(snakemake.output.done))
