"""Rule export: a run's final snapshot in the Hugging Face format (eval.use_ema: its EMA)."""

from pathlib import Path

from pipeline_lib.export import export_snapshot
from pipeline_lib.workflow.io import script_logging

snakemake = globals()["snakemake"]

with script_logging(snakemake.log[0], snakemake.threads):
    export_snapshot(Path(snakemake.input.snapshot), Path(snakemake.output.export),
                    use_ema=bool(snakemake.params.use_ema))
