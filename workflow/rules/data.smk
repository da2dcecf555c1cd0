# Corpus → tokenizer → packed epoch shards, one pack per distinct data config.


rule pack_data:
    output:
        data_dir=directory(PLAN.layout.data_dir("{data_id}")),
    params:
        data=lambda wc: PLAN.data_params(wc.data_id),
    log:
        job_log("pack_data", "{data_id}"),
    benchmark:
        job_benchmark("pack_data", "{data_id}")
    resources:
        **JOB_RESOURCES,
    conda:
        "../../envs/data.yaml"
    script:
        "../scripts/pack_data.py"
