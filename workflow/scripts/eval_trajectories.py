"""Rule eval_trajectories: latent trajectories of sampled validation tokens (opt-in)."""

from pathlib import Path

from pipeline_lib.workflow.io import run_job
from pipeline_lib.workflow.stages.trajectories import trajectories_stage

snakemake = globals()["snakemake"]

with run_job(snakemake, snakemake.threads) as cfg:
    trajectories_stage(cfg, Path(snakemake.params.run_dir), Path(snakemake.input.snapshot),
                       Path(snakemake.input.data), Path(snakemake.output.out))
