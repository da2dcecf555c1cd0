# MLflow: the store is created once, then one parent run per variant (tracking.json).
from pipeline_lib.credentials import redact_uri


localrules:
    tracking_store,
    track_init,


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
        tracking=RUN.tracking_json,
    params:
        run=lambda wc: wc.run,
        run_dir=lambda wc: PLAN.run_dir(wc.run),
    log:
        RUN.log("track_init"),
    conda:
        "../../envs/track.yaml"
    script:
        "../scripts/track_init.py"
