# MLflow: the store is created once, then one parent run per variant (tracking.json).
from pipeline_lib.credentials import redact_uri


localrules:
    tracking_store,
    track_init,
    track_config,
    track_done,


rule tracking_store:
    output:
        marker=PLAN.layout.tracking_marker,
    params:
        uri=redact_uri(PLAN.config.tracking.uri),  # Snakemake stores params: no password
        experiment=PLAN.config.experiment.name,
        enabled=PLAN.config.tracking.enabled,
    log:
        job_log("tracking_store"),
    conda:
        "../../envs/track.yaml"
    script:
        "../scripts/tracking_store.py"


rule track_init:
    input:
        store=ancient(rules.tracking_store.output.marker),
        data=lambda wc: PLAN.data_dir(wc.run),
    output:
        ready=RUN.tracking_ready,  # written last: tracking.json is written before it
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
        spec=lambda wc: PLAN.spec_ref(wc.run),
    log:
        RUN.log("track_init"),
    conda:
        "../../envs/track.yaml"
    script:
        "../scripts/track_init.py"


# A config change brings the parent run up to date (config hash, changed params, config
# artifact). Its own rule, which only `all` needs: were the signature a param of
# track_init, whose output every stage reads through ancient(), Snakemake would skip the
# stages' own param checks once track_init must rerun, and a changed train.lr would not
# retrain.
rule track_config:
    input:
        tracking=RUN.tracking_ready,
    output:
        parent=RUN.parent_config,
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
        spec=lambda wc: PLAN.spec_ref(wc.run),
        data_id=lambda wc: PLAN.runs[wc.run].data_id,
        signature=lambda wc: PLAN.config_signature(wc.run),
    log:
        RUN.log("track_config"),
    conda:
        "../../envs/track.yaml"
    script:
        "../scripts/track_config.py"


# The parent run's lifetime is its variant's pipeline: stages set it RUNNING (FAILED when one
# fails); once every target of the run is built it is FINISHED here. The Snakefile's
# onsuccess/onerror handlers close the parents a partial or failed invocation left open.
rule track_done:
    input:
        targets=lambda wc: PLAN.run_targets(wc.run),
    output:
        done=RUN.parent_done,
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
        spec=lambda wc: PLAN.spec_ref(wc.run),
    log:
        RUN.log("track_done"),
    conda:
        "../../envs/track.yaml"
    script:
        "../scripts/track_done.py"
