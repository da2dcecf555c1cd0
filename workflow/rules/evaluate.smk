# H_eff sweep: validation loss at every eval.h_eff for each kept snapshot, one pass each
# (plus the per-token adaptive exit at every eval.adaptive_thresholds, a second pass).


rule eval_heff:
    input:
        snapshot=lambda wc: PLAN.snapshot_path(wc.run, int(wc.step)),
        data=lambda wc: PLAN.data_dir(wc.run),
        tracking=lambda wc: ancient(f"{RESULTS}/{wc.run}/tracking.json"),
    output:
        result=f"{RESULTS}/{{run}}/eval/heff/step_{{step}}.json",
    params:
        run=lambda wc: wc.run,
        signature=lambda wc: PLAN.eval_signature(wc.run),
    log:
        "logs/eval_heff/{run}/step_{step}.log",
    benchmark:
        "benchmarks/eval_heff/{run}/step_{step}.tsv"
    threads: PLAN.threads("eval")
    resources:
        **PLAN.cluster_resources("eval"),
    conda:
        "../../envs/evaluate.yaml"
    script:
        "../scripts/eval_heff.py"


rule summarize_heff:
    input:
        results=lambda wc: heff_results(wc.run),
    output:
        table=f"{RESULTS}/{{run}}/eval/heff.parquet",
        plot=report(
            f"{RESULTS}/{{run}}/eval/heff.png",
            caption="../report/heff.rst",
            category="H_eff sweep",
            labels={"run": "{run}"},
        ),
        adaptive_table=f"{RESULTS}/{{run}}/eval/heff_adaptive.parquet",
        adaptive_plot=report(
            f"{RESULTS}/{{run}}/eval/heff_adaptive.png",
            caption="../report/heff_adaptive.rst",
            category="Adaptive exit",
            labels={"run": "{run}"},
        ),
    params:
        run=lambda wc: wc.run,
    log:
        "logs/summarize_heff/{run}.log",
    conda:
        "../../envs/evaluate.yaml"
    script:
        "../scripts/summarize_heff.py"
