# Input functions over PLAN (the Snakefile's plan of the run tree). Imports stay torch-free:
# this runs on every call.
from pipeline_lib.run_layout import job_benchmark, job_log

# Every path of a run comes from pipeline_lib.run_layout: RUN holds them as patterns
# ({run}, {step}); the input functions below fill them in for one run.
RUN = PLAN.run_layout("{run}")
STEP = "{step}"


wildcard_constraints:
    data_id="[0-9a-f]{12}",
    run="|".join(PLAN.run_names),
    step=r"\d{7}",


def compare_inputs(wildcards):
    return PLAN.compare_inputs()
