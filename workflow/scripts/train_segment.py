"""Rule train_segment(_temp): train one segment from the previous snapshot (or from scratch,
or warm-started from the imported init/ snapshot), in this process or as a torchrun job of
train.nproc processes."""

from pipeline_lib.train.preempt import latch_stop_signals

latch_stop_signals()  # before torch loads: a SIGUSR1/SIGTERM from now on stops with a resume point

from pathlib import Path  # noqa: E402

from pipeline_lib.export.hf_import import source_teacher  # noqa: E402
from pipeline_lib.train.launch import run_training_job  # noqa: E402
from pipeline_lib.workflow.attempt_log import current_attempt  # noqa: E402
from pipeline_lib.workflow.io import run_job  # noqa: E402

snakemake = globals()["snakemake"]

with run_job(snakemake, snakemake.threads) as cfg:
    out = Path(snakemake.output.snapshot)
    previous = snakemake.input.previous
    init = snakemake.input.init
    run_training_job(
        cfg,
        data_dir=Path(snakemake.input.data),
        resume_from=Path(previous[0]) if previous else None,
        until_step=int(snakemake.wildcards.step),
        out=out,
        run_dir=Path(snakemake.params.run_dir),
        attempt=current_attempt(snakemake.log[0]),  # > 1: a retry (rolls back past a spike)
        warm_start=Path(init[0]) if init else None,
        build_source=source_teacher,  # train.distill.teacher = source
    )
