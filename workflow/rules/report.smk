# Side-by-side comparison of every variant (also in `snakemake --report`).
import os

COMPARE = PLAN.layout.compare_dir


rule compare_runs:
    input:
        unpack(compare_inputs),
    output:
        summary=COMPARE / "summary.md",
        table=COMPARE / "summary.parquet",
        depth=COMPARE / "depth_check.json",
        loss=report(COMPARE / "loss_vs_heff.png", caption="../report/compare.rst",
                    category="Comparison"),
        accuracy=report(COMPARE / "accuracy_vs_heff.png", caption="../report/compare.rst",
                        category="Comparison"),
        train=report(COMPARE / "train_loss.png", caption="../report/compare.rst",
                     category="Comparison"),
    params:
        runs=PLAN.run_names,
        out_dir=lambda wc, output: os.path.dirname(output.summary),  # = COMPARE
        metrics=PLAN.metrics_files(),
    log:
        job_log("compare_runs"),
    resources:
        **JOB_RESOURCES,
    conda:
        "../../envs/evaluate.yaml"
    script:
        "../scripts/compare_runs.py"
