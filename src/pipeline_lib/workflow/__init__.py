"""The workflow side: what the Snakemake rules and the CLI call.

- :mod:`.plan`: :class:`~.plan.WorkflowPlan`, runs, data packs and snapshot steps computed
  from the Snakemake config (what the Snakefile imports; torch-, mlflow- and lm-eval-free).
- :mod:`.stages`: one function per stage, tracking included; rules and CLI commands alike.
- :mod:`.io`: logging and thread limits for the scripts in ``workflow/scripts``.

The run layout, the run's length, the signatures and the snapshot policy (where segments end,
which snapshots are kept) live in :mod:`pipeline_lib.spec`, the torch-free floor under
everything: the trainer and tracking use them too. This module imports nothing, so that
importing the plan stays cheap.
"""
