# Plan of the run tree and input functions. Imports stay torch-free: this runs on every call.
from pipeline_lib.workflow_plan import WorkflowPlan

PLAN = WorkflowPlan(config)
RESULTS = str(PLAN.results)


wildcard_constraints:
    data_id="[0-9a-f]{12}",
    run="|".join(PLAN.run_names),
    step=r"\d{7}",


def heff_results(run):
    return [f"{RESULTS}/{run}/eval/heff/step_{s:07d}.json" for s in PLAN.runs[run].kept_steps]


def bench_results(run):
    return [f"{RESULTS}/{run}/bench/step_{s:07d}.json" for s in PLAN.bench_steps(run)]


def all_targets():
    targets = []
    for run in PLAN.run_names:
        targets += [
            f"{RESULTS}/{run}/snapshots/index.json",
            f"{RESULTS}/{run}/eval/heff.parquet",
            f"{RESULTS}/{run}/eval/heff.png",
            f"{RESULTS}/{run}/bench/summary.parquet",
            f"{RESULTS}/{run}/bench/accuracy_vs_heff.png",
        ]
    return targets + [f"{RESULTS}/compare/summary.md"]


def compare_inputs(wildcards):
    """Per run: its H_eff table, its final benchmark JSON and its snapshot index."""
    inputs = {}
    for run in PLAN.run_names:
        final = PLAN.runs[run].final_step
        inputs[f"{run}_heff"] = f"{RESULTS}/{run}/eval/heff.parquet"
        inputs[f"{run}_bench"] = f"{RESULTS}/{run}/bench/step_{final:07d}.json"
        inputs[f"{run}_index"] = f"{RESULTS}/{run}/snapshots/index.json"
    return inputs
