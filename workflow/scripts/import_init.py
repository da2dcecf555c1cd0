"""Rule import_init: the run's model.init_from source imported as a loopline snapshot
(init/), tracked as the stage run ``import``."""

from pathlib import Path

from pipeline_lib.workflow.io import run_job
from pipeline_lib.workflow.stages.interop import import_stage

snakemake = globals()["snakemake"]

with run_job(snakemake, snakemake.threads) as cfg:
    import_stage(cfg, Path(snakemake.params.run_dir), Path(snakemake.output.snapshot))
