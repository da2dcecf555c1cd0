# One job per training segment; each resumes the previous segment's snapshot exactly.
# Kept snapshots: snapshots/step_{step}; the others are temp() under snapshots/segments/
# and deleted once the next segment has consumed them.


rule train_segment:
    input:
        data=lambda wc: PLAN.data_dir(wc.run),
        previous=lambda wc: PLAN.previous_snapshot(wc.run, int(wc.step)),
        tracking=lambda wc: ancient(f"{RESULTS}/{wc.run}/tracking.json"),
    output:
        snapshot=directory(f"{RESULTS}/{{run}}/snapshots/step_{{step}}"),
    params:
        run=lambda wc: wc.run,
        signature=lambda wc: PLAN.train_signature(wc.run),
    log:
        "logs/train_segment/{run}/step_{step}.log",
    benchmark:
        "benchmarks/train_segment/{run}/step_{step}.tsv"
    retries: 1
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
        snapshot=temp(directory(f"{RESULTS}/{{run}}/snapshots/segments/step_{{step}}")),
    log:
        "logs/train_segment/{run}/segments/step_{step}.log",
    benchmark:
        "benchmarks/train_segment/{run}/segments/step_{step}.tsv"


rule snapshot_index:
    input:
        kept=lambda wc: PLAN.kept_snapshots(wc.run),
    output:
        index=f"{RESULTS}/{{run}}/snapshots/index.json",
    log:
        "logs/snapshot_index/{run}.log",
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/snapshot_index.py"
