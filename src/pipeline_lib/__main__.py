"""`python -m pipeline_lib <stage> …`: the same code path the Snakemake rules call."""

from .cli import main

raise SystemExit(main())
