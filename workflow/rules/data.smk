# Corpus → tokenizer → packed epoch shards, one pack per distinct data config.


rule pack_data:
    output:
        data_dir=directory(f"{RESULTS}/data/{{data_id}}"),
    params:
        data=lambda wc: PLAN.data_params(wc.data_id),
    log:
        f"logs/pack_data/{{data_id}}.log",
    benchmark:
        "benchmarks/pack_data/{data_id}.tsv"
    conda:
        "../../envs/data.yaml"
    script:
        "../scripts/pack_data.py"
