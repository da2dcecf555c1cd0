# The final snapshot of each run in the Hugging Face format (transformers, lm-eval's hf model).


rule export:
    input:
        snapshot=lambda wc: PLAN.final_snapshot(wc.run),
    output:
        export=directory(RUN.export_dir),
    params:
        use_ema=lambda wc: PLAN.runs[wc.run].config.eval.use_ema,
    log:
        RUN.log("export"),
    conda:
        "../../envs/evaluate.yaml"
    script:
        "../scripts/export_hf.py"
