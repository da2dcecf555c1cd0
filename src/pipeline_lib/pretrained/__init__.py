"""Pretrained sources, torch-free: a Hugging Face directory or GGUF file read and checked from
its headers (:mod:`.pretrained_source`), its layer choices, and a run's model section from it
(:mod:`.init`). The tensors are read by :mod:`pipeline_lib.retrofit`."""
