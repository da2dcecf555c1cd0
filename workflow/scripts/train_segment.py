"""Rule train_segment(_temp): train one segment from the previous snapshot (or from scratch)."""

from pathlib import Path

from pipeline_lib.train import train_segment
from pipeline_lib.workflow_io import run_config, script_logging

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0]):
    out = Path(snakemake.output.snapshot)
    previous = snakemake.input.previous
    train_segment(
        run_config(snakemake),
        data_dir=Path(snakemake.input.data),
        resume_from=Path(previous[0]) if previous else None,
        until_step=int(snakemake.wildcards.step),
        out=out,
        run_dir=Path(snakemake.input.tracking).parent,
        attempt=snakemake.attempt,
    )
