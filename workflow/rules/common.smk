# Input functions over PLAN (the Snakefile's plan of the run tree). Imports stay torch-free:
# this runs on every call.
from pipeline_lib.spec.layout import job_benchmark, job_log

# Every path of a run comes from pipeline_lib.spec.layout: RUN holds them as patterns
# ({run}, {step}); the input functions below fill them in for one run.
RUN = PLAN.run_layout("{run}")
STEP = "{step}"

# Every job of a run reads its completed config from the spec file its params.spec names
# (PLAN.spec_ref(run): the run and the spec's digest) and checks it before any work. The
# digest changes with any key, but it is no object Snakemake's params trigger records: the
# signatures among the params decide what reruns, and finished runs stay finished.


# SLURM resources of every submitted rule, from the config's resources: and train: sections
# (pipeline_lib.workflow.cluster_resources decides); override one rule with Snakemake's own
# set-resources (profile or command line). Local rules (track.smk, segment_anchor) are not
# submitted.
TRAIN_RESOURCES = PLAN.cluster_resources("train")  # import_init
SEGMENT_RESOURCES = {**TRAIN_RESOURCES, **PLAN.segment_time()}  # + the early SIGUSR1
JOB_RESOURCES = PLAN.cluster_resources("eval")  # every other submitted rule


wildcard_constraints:
    data_id="[0-9a-f]{12}",
    run="|".join(PLAN.run_names),
    step=r"\d{7}",


def compare_inputs(wildcards):
    return PLAN.compare_inputs()


def trajectory_targets(wildcards):
    """Rule trajectories (opt-in, never in all): every run's final snapshot's trajectories."""
    return [str(PLAN.run_layout(run).trajectories_dir(PLAN.runs[run].final_step))
            for run in PLAN.run_names]
