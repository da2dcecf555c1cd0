# Side-by-side comparison of every variant (also in `snakemake --report`).


rule compare_runs:
    input:
        unpack(compare_inputs),
    output:
        summary=f"{RESULTS}/compare/summary.md",
        table=f"{RESULTS}/compare/summary.parquet",
        depth=f"{RESULTS}/compare/depth_check.json",
        loss=report(f"{RESULTS}/compare/loss_vs_heff.png", caption="../report/compare.rst",
                    category="Comparison"),
        accuracy=report(f"{RESULTS}/compare/accuracy_vs_heff.png",
                        caption="../report/compare.rst", category="Comparison"),
        train=report(f"{RESULTS}/compare/train_loss.png", caption="../report/compare.rst",
                     category="Comparison"),
    params:
        runs=PLAN.run_names,
    log:
        "logs/compare_runs.log",
    conda:
        "../../envs/evaluate.yaml"
    script:
        "../scripts/compare_runs.py"
