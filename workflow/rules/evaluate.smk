# H_eff sweep: validation loss at every eval.h_eff for each kept snapshot, one pass each
# (plus the per-token adaptive exit of every eval.adaptive.criteria, from the same pass).


rule eval_heff:
    input:
        snapshot=lambda wc: PLAN.snapshot_path(wc.run, int(wc.step)),
        data=lambda wc: PLAN.data_dir(wc.run),
        tracking=ancient(RUN.tracking_ready),
    output:
        result=RUN.heff_result(STEP),
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
        spec=lambda wc: PLAN.spec_ref(wc.run),
        signature=lambda wc: PLAN.eval_signature(wc.run),
    log:
        RUN.log("eval_heff", STEP),
    benchmark:
        RUN.benchmark("eval_heff", STEP)
    threads: PLAN.threads("eval")
    resources:
        **JOB_RESOURCES,
    conda:
        "../../envs/evaluate.yaml"
    script:
        "../scripts/eval_heff.py"


rule summarize_heff:
    input:
        results=lambda wc: PLAN.heff_results(wc.run),
    output:
        table=RUN.heff_table,
        plot=report(
            RUN.heff_plot,
            caption="../report/heff.rst",
            category="H_eff sweep",
            labels={"run": "{run}"},
        ),
        adaptive_table=RUN.adaptive_table,
        adaptive_plot=report(
            RUN.adaptive_plot,
            caption="../report/heff_adaptive.rst",
            category="Adaptive exit",
            labels={"run": "{run}"},
        ),
        label_table=RUN.label_table,
        label_plot=report(
            RUN.label_plot,
            caption="../report/heff_labels.rst",
            category="Label accuracy",
            labels={"run": "{run}"},
        ),
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
        spec=lambda wc: PLAN.spec_ref(wc.run),
    log:
        RUN.log("summarize_heff"),
    resources:
        **JOB_RESOURCES,
    conda:
        "../../envs/evaluate.yaml"
    script:
        "../scripts/summarize_heff.py"


# Latent trajectories (opt-in: `snakemake trajectories`, or one snapshot's directory as the
# target): how sampled validation tokens' loop states move up to 2 × model.loops; no other
# rule needs them, so `all` never asks for them and no config key switches them on.


rule eval_trajectories:
    input:
        snapshot=lambda wc: PLAN.snapshot_path(wc.run, int(wc.step)),
        data=lambda wc: PLAN.data_dir(wc.run),
        tracking=ancient(RUN.tracking_ready),
    output:
        out=directory(RUN.trajectories_dir(STEP)),
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
        spec=lambda wc: PLAN.spec_ref(wc.run),
    log:
        RUN.log("eval_trajectories", STEP),
    benchmark:
        RUN.benchmark("eval_trajectories", STEP)
    threads: PLAN.threads("eval")
    resources:
        **JOB_RESOURCES,
    conda:
        "../../envs/evaluate.yaml"
    script:
        "../scripts/eval_trajectories.py"


rule trajectories:
    input:
        trajectory_targets,
