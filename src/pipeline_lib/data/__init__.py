"""Data stage: corpus sources → tokenizer → tokens.bin → packed epoch shards → batches.

Modules (each imported on its own; this package imports nothing heavy). The pack's identity,
``data_id`` (short hash of everything that determines the packed bytes), is
:mod:`pipeline_lib.spec.data_id`: the Snakefile computes it on every call.

- :mod:`.reasoning`: seeded procedural problems (k-hop chains, addition, parity).
- :mod:`.sources`: streaming readers for parquet, jsonl, text, stdlib and reasoning sources.
- :mod:`.tokenizer`: byte-level or trained BPE tokenizers (HF ``tokenizers``), special ids.
- :mod:`.tokenizer_files`, :mod:`.gguf_metadata`: a pretrained tokenizer's files, read cheaply
  (vocabulary size, GGUF metadata).
- :mod:`.tokenizer_source`: a pretrained tokenizer (tokenizer.json, HF directory, GGUF) built.
- :mod:`.token_stream`: the corpus tokenized into ``tokens.bin`` ([BOS] text answer EOS).
- :mod:`.packing`: document splitting and best-fit-decreasing packing into rows.
- :mod:`.pack`: ``pack_corpus``, the whole stage, written atomically.
- :mod:`.loader`: deterministic, resumable batches over a packed directory.
- :mod:`.verify`: every file of a pack checked against its metadata, hashed once.
"""
