# Downstream benchmarks through lm-evaluation-harness at every bench.h_eff.


rule bench_downstream:
    input:
        snapshot=lambda wc: PLAN.snapshot_path(wc.run, int(wc.step)),
        tracking=lambda wc: ancient(f"{RESULTS}/{wc.run}/tracking.json"),
        user_tasks=lambda wc: PLAN.bench_task_files(wc.run),
    output:
        result=f"{RESULTS}/{{run}}/bench/step_{{step}}.json",
        tasks=temp(directory(f"{RESULTS}/{{run}}/bench/tasks_step_{{step}}")),
    params:
        run=lambda wc: wc.run,
        signature=lambda wc: PLAN.bench_signature(wc.run),
    log:
        "logs/bench_downstream/{run}/step_{step}.log",
    benchmark:
        "benchmarks/bench_downstream/{run}/step_{step}.tsv"
    threads: PLAN.threads("eval")
    resources:
        **PLAN.cluster_resources("eval"),
    conda:
        "../../envs/bench.yaml"
    script:
        "../scripts/bench_downstream.py"


rule summarize_bench:
    input:
        results=lambda wc: bench_results(wc.run),
    output:
        table=f"{RESULTS}/{{run}}/bench/summary.parquet",
        plot=report(
            f"{RESULTS}/{{run}}/bench/accuracy_vs_heff.png",
            caption="../report/bench.rst",
            category="Downstream benchmarks",
            labels={"run": "{run}"},
        ),
    params:
        run=lambda wc: wc.run,
    log:
        "logs/summarize_bench/{run}.log",
    conda:
        "../../envs/bench.yaml"
    script:
        "../scripts/summarize_bench.py"
