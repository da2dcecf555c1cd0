"""Rule import_init: the run's model.init_from source imported as a loopline snapshot
(init/), tracked as the stage run ``import``; what the plan resolved the source to (the
spec's ``init`` record) is what is imported."""

from pathlib import Path

from pipeline_lib.workflow.io import run_job, run_spec
from pipeline_lib.workflow.stages.interop import import_stage

snakemake = globals()["snakemake"]

with run_job(snakemake, snakemake.threads) as cfg:
    import_stage(cfg, run_spec(snakemake).init, Path(snakemake.params.run_dir),
                 Path(snakemake.output.snapshot))
