# loopline: pack a corpus, train a looped transformer in segments, sweep test-time depth,
# run downstream benchmarks, track everything in MLflow. All logic lives in src/pipeline_lib.
from snakemake.utils import min_version, validate

from pipeline_lib.config import apply_default_config

min_version("9.0")

# The embedded default is config/config.yaml; --configfile and --config are merged over it
# (a file that lists runs: replaces the default variants rather than adding to them).
apply_default_config(config)
# set_default=False: the schema's defaults would also fill every key of a runs: variant,
# turning a partial override into a full one; pipeline_lib.config fills defaults itself.
validate(config, "workflow/schemas/config.schema.yaml", set_default=False)


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/track.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        PLAN.all_targets(),
    default_target: True
