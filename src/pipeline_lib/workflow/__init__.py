"""The workflow side: what the Snakemake rules and the CLI call.

- :mod:`.plan`: :class:`~.plan.WorkflowPlan`, runs, data packs and snapshot steps computed
  from the Snakemake config (what the Snakefile imports; torch-, mlflow- and lm-eval-free).
- :mod:`.stages`: one function per stage, tracking included; rules and CLI commands alike.
- :mod:`.io`: logging and thread limits for the scripts in ``workflow/scripts``.
- :mod:`.snapshots_policy`: where segments end and which snapshots are kept (torch-free).

The run layout (:mod:`pipeline_lib.run_layout`) and the run's length
(:mod:`pipeline_lib.train.budget`) stay outside: the trainer and tracking use them too, and
they sit below this package in the layers. This module imports nothing, so that importing
the plan stays cheap.
"""
