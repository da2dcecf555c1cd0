# MLflow: the store is created once, then one parent run per variant (tracking.json).


localrules:
    tracking_store,
    track_init,


rule tracking_store:
    output:
        marker=f"{RESULTS}/.tracking/store.json",
    params:
        uri=PLAN.config.tracking.uri,
        experiment=PLAN.config.experiment.name,
        enabled=PLAN.config.tracking.enabled,
    log:
        "logs/tracking_store.log",
    conda:
        "../../envs/track.yaml"
    script:
        "../scripts/tracking_store.py"


rule track_init:
    input:
        store=ancient(rules.tracking_store.output.marker),
        data=lambda wc: PLAN.data_dir(wc.run),
    output:
        tracking=f"{RESULTS}/{{run}}/tracking.json",
    params:
        run=lambda wc: wc.run,
    log:
        "logs/track_init/{run}.log",
    conda:
        "../../envs/track.yaml"
    script:
        "../scripts/track_init.py"
