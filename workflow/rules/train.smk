# One job per training segment; each resumes the previous segment's snapshot exactly.
# Kept snapshots: snapshots/step_{step}; the others are temp() under snapshots/transient/
# and deleted once the next segment has consumed them.


rule train_segment:
    input:
        data=lambda wc: PLAN.data_dir(wc.run),
        previous=lambda wc: PLAN.previous_snapshot(wc.run, int(wc.step)),
        tracking=ancient(RUN.tracking_json),
    output:
        snapshot=directory(RUN.snapshot(STEP)),
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
        signature=lambda wc: PLAN.train_signature(wc.run),
    log:
        RUN.log("train_segment", STEP),
    benchmark:
        RUN.benchmark("train_segment", STEP)
    retries: 2  # a stop (resume point) or a spike abort (rollback) is retried
    threads: PLAN.threads("train")
    resources:
        **PLAN.cluster_resources("train"),
        runtime=lambda wc: PLAN.runs[wc.run].config.train.segment_runtime_minutes,
        attempt=lambda wc, attempt: attempt,  # a retry (attempt 2) rolls back past a spike
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/train_segment.py"


use rule train_segment as train_segment_temp with:
    output:
        snapshot=temp(directory(RUN.snapshot(STEP, kept=False))),
    log:
        RUN.log("train_segment", STEP, kept=False),
    benchmark:
        RUN.benchmark("train_segment", STEP, kept=False)


rule snapshot_index:
    input:
        kept=lambda wc: PLAN.kept_snapshots(wc.run),
    output:
        index=RUN.index,
    log:
        RUN.log("snapshot_index"),
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/snapshot_index.py"
