"""Rule train_segment(_temp): train one segment from the previous snapshot (or from scratch,
or warm-started from the imported init/ snapshot), in this process or as a torchrun job of
train.nproc processes."""

from pipeline_lib.train.preempt import latch_stop_signals

latch_stop_signals()  # before torch loads: a SIGUSR1/SIGTERM from now on stops with a resume point

from pathlib import Path  # noqa: E402

from pipeline_lib.workflow.attempt_log import current_attempt  # noqa: E402
from pipeline_lib.workflow.io import run_job  # noqa: E402
from pipeline_lib.workflow.stages.train import train_stage  # noqa: E402

snakemake = globals()["snakemake"]

with run_job(snakemake, snakemake.threads) as cfg:
    previous, init = snakemake.input.previous, snakemake.input.init
    train_stage(cfg, Path(snakemake.input.data), Path(previous[0]) if previous else None,
                int(snakemake.wildcards.step), Path(snakemake.output.snapshot),
                Path(snakemake.params.run_dir),
                attempt=current_attempt(snakemake.log[0]),  # > 1: a retry (a rollback)
                warm_start=Path(init[0]) if init else None,
                signature=snakemake.params.signature)  # where the snapshot went, under it
