# Downstream benchmarks through lm-evaluation-harness at every bench.h_eff.


rule bench_downstream:
    input:
        snapshot=lambda wc: PLAN.snapshot_path(wc.run, int(wc.step)),
        tracking=ancient(RUN.tracking_ready),
        user_tasks=lambda wc: PLAN.bench_task_files(wc.run),
    output:
        result=RUN.bench_result(STEP),
        tasks=temp(directory(RUN.bench_tasks(STEP))),
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
        spec=lambda wc: PLAN.spec_ref(wc.run),
        signature=lambda wc: PLAN.bench_signature(wc.run),
    log:
        RUN.log("bench_downstream", STEP),
    benchmark:
        RUN.benchmark("bench_downstream", STEP)
    threads: PLAN.threads("eval")
    resources:
        **JOB_RESOURCES,
    conda:
        "../../envs/bench.yaml"
    script:
        "../scripts/bench_downstream.py"


rule summarize_bench:
    input:
        results=lambda wc: PLAN.bench_results(wc.run),
    output:
        table=RUN.bench_table,
        plot=report(
            RUN.bench_plot,
            caption="../report/bench.rst",
            category="Downstream benchmarks",
            labels={"run": "{run}"},
        ),
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
        spec=lambda wc: PLAN.spec_ref(wc.run),
    log:
        RUN.log("summarize_bench"),
    resources:
        **JOB_RESOURCES,
    conda:
        "../../envs/bench.yaml"
    script:
        "../scripts/summarize_bench.py"
