# One job per training segment; each resumes the previous segment's snapshot exactly.
# Kept snapshots: snapshots/step_{step}; the others are temp() under snapshots/transient/
# and deleted once the next segment has consumed them. A model.init_from run first imports
# the pretrained model (init/), and its first segment warm-starts from that.


rule import_init:
    input:
        source=lambda wc: PLAN.init_source(wc.run),
        tracking=ancient(RUN.tracking_ready),
    output:
        snapshot=directory(RUN.init_dir),
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
        spec=lambda wc: PLAN.spec_ref(wc.run),
        signature=lambda wc: PLAN.init_signature(wc.run),
    log:
        RUN.log("import_init"),
    resources:
        **TRAIN_RESOURCES,
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/import_init.py"


rule train_segment:
    input:
        unpack(lambda wc: PLAN.segment_inputs(wc.run, int(wc.step))),  # data, previous, init
        tracking=ancient(RUN.tracking_ready),
    output:
        snapshot=directory(RUN.snapshot(STEP)),
    params:
        run="{run}",  # a string, not a function: Snakemake fills in the wildcard cheaply
        run_dir=lambda wc: PLAN.run_dir(wc.run),  # (snakemake --lint wants no path prefix)
        spec=lambda wc: PLAN.spec_ref(wc.run),
        signature=lambda wc: PLAN.train_signature(wc.run),
    log:
        RUN.log("train_segment", STEP),
    benchmark:
        RUN.benchmark("train_segment", STEP)
    retries: 2  # a stop (resume point) or a spike abort (rollback) is retried
    threads: PLAN.threads("train")
    resources:
        **SEGMENT_RESOURCES,
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


# Every 100th segment of a long run of temporary ones gets an anchor, a target of rule all:
# a copy of the segment's benchmark record (not its snapshot, which goes as before). Targets
# are resolved in step order, so each chain Snakemake follows ends at the previous anchor or
# kept snapshot: planning stays linear in the segments, with no recursion limit.
localrules:
    segment_anchor,


rule segment_anchor:
    input:
        record=RUN.benchmark("train_segment", STEP, kept=False),
    output:
        anchor=RUN.anchor(STEP),
    log:
        RUN.log("segment_anchor", STEP),
    conda:
        "../../envs/train.yaml"  # only cp; the env the segments already use
    shell:
        "cp {input.record:q} {output.anchor:q} 2> {log:q}"


rule snapshot_index:
    input:
        kept=lambda wc: PLAN.kept_snapshots(wc.run),
    output:
        index=RUN.index,
    log:
        RUN.log("snapshot_index"),
    resources:
        **JOB_RESOURCES,
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/snapshot_index.py"
