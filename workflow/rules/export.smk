# The final snapshot of each run in the Hugging Face format (transformers, lm-eval's hf model),
# logged as an MLflow logged model of the run's train run.


rule export:
    input:
        snapshot=lambda wc: PLAN.final_snapshot(wc.run),
        data=lambda wc: PLAN.data_dir(wc.run),
        tracking=ancient(RUN.tracking_ready),
    output:
        export=directory(RUN.export_dir),
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
        spec=lambda wc: PLAN.spec_ref(wc.run),
        use_ema=lambda wc: PLAN.runs[wc.run].config.eval.use_ema,
    log:
        RUN.log("export"),
    resources:
        **JOB_RESOURCES,
    conda:
        "../../envs/evaluate.yaml"
    script:
        "../scripts/export_hf.py"
