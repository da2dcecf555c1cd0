"""The one door of every stage: a function per stage, its output checks and its MLflow
tracking inside. The Snakemake rule's script (workflow/scripts) and the CLI command
(:mod:`pipeline_lib.commands`) call the same function; ``--no-track`` (``tracking.enabled:
false``) is the only difference between them.

- :mod:`.data`: ``pack`` (the corpus packed once per data config) and ``index``
  (snapshots/index.json and the ``final`` link).
- :mod:`.train`: one training segment (``train`` child run, continued across segments).
- :mod:`.heff`, :mod:`.heff_summary`, :mod:`.bench`: the H_eff sweep and the downstream
  benchmarks of one snapshot, and their summaries (the heff summary loads no torch).
- :mod:`.trajectories`: the latent trajectories of one snapshot (opt-in: rule
  ``eval_trajectories``, reached only through the target rule ``trajectories``).
- :mod:`.interop`: ``import`` of a pretrained source and ``export`` in the Hugging Face format.
- :mod:`.compare`: the comparison of finished runs (no child run: it belongs to no one run).
- :mod:`.parent_runs`: the store, the variant's parent run and its ``pack`` child; the
  Snakefile's onsuccess/onerror handler (torch-free: the Snakefile imports it).
- :mod:`.common`: the checks every stage makes before it writes anything.

This package imports nothing itself, so importing one door costs only that door.
"""
