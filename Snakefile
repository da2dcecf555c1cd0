# loopline: pack a corpus, train a looped transformer in segments, sweep test-time depth,
# run downstream benchmarks, track everything in MLflow. All logic lives in src/pipeline_lib.
from snakemake.logging import logger
from snakemake.utils import min_version

from pipeline_lib.workflow.cluster_job import enter_cluster_job
from pipeline_lib.workflow.hooks import end_workflow, start_workflow
from pipeline_lib.workflow.plan import plan_for_snakemake
from pipeline_lib.workflow.run_specs import export_digests

min_version("9.0")

# The embedded default is config/config.yaml; the --configfile files are merged over it in
# the order given, by loopline's rules rather than Snakemake's (a file that lists runs:
# replaces the variants before it rather than adding to them), --config last, then validated
# by the same code as the stage commands: a bad key or value, in a runs: variant too, ends
# here with their one-line `error: …`. No snakemake.utils.validate: the schema in
# workflow/schemas is generated from the same dataclasses and bounds (it documents them), and
# it would reject Snakemake's string-valued --config entries that the loader converts.
# Each run's config is completed once here (pipeline_lib.workflow.resolve.resolve_run) and
# written to {run}/specs/{digest}.yaml by onstart, before the first job; every job's
# params.spec names that digest, and the job reads and checks exactly that file instead of
# planning the experiment again. A job's own Snakemake (a cluster job's, or one a job spawns)
# plans with the same files: the digests travel in its environment
# (pipeline_lib.workflow.run_specs).
IN_JOB = workflow.remote_exec or workflow.subprocess_exec
PLAN = plan_for_snakemake(config, workflow.config_settings.configfiles,
                          workflow.config_settings.config, in_job=IN_JOB)


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/track.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/report.smk"


# Inside a cluster job: no retries there (a retry is a new job), SIGUSR1 left to the stage, a
# stopped segment exits 75 (pipeline_lib.workflow.cluster_job).
if workflow.remote_exec:
    enter_cluster_job(workflow, PLAN)
if not IN_JOB:  # the main call: its digests go to its jobs; what retention did not do
    export_digests(workflow, PLAN.spec_digests())
    for note in PLAN.retention_notes():
        logger.warning(note)


rule all:
    input:
        PLAN.all_targets(),
    default_target: True


# Before any job (pipeline_lib.workflow.hooks): under the SLURM executor, a cluster whose
# sacct cannot report jobs (no accounting storage) ends here in one line naming the fix;
# then the results directory is held (another working directory's workflow using it ends
# this one in one line: pipeline_lib.workflow.results_lock); then every run's spec file is
# written (where missing), before any job reads it. Not a rule: a rule keyed on the
# config would, when it must rerun, mask every job below it from Snakemake's own params
# checks (see track.smk's track_config), and a changed train.lr would not retrain.
onstart:
    start_workflow(workflow, PLAN)


# MLflow parent runs a stage opened and no track_done closed (only some targets asked for, a
# failed or killed stage) end with the invocation (no cost when none is open); then the
# results directory is let go.
onsuccess:
    end_workflow(PLAN, "FINISHED")


onerror:
    end_workflow(PLAN, "FAILED")
