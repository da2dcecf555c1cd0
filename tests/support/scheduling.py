"""How ``make test`` shares test files out to its xdist workers (read by tests/conftest.py)."""

from __future__ import annotations

# Where the slow files are whole Snakemake pipelines (minutes each): these start first.
WHOLE_PIPELINE_DIRS = ("tests/workflow/", "tests/reliability/")

# Files that share one session fixture built by a whole pipeline run (``tiny_pipeline``, in
# tests/workflow/conftest.py): one work unit, so that one worker builds it once.
SHARED_FIXTURE_UNITS = {
    "tests/workflow/test_tiny_pipeline.py": "tiny_pipeline",
    "tests/workflow/test_stage_doors.py": "tiny_pipeline",
    "tests/workflow/test_trajectories_rule.py": "tiny_pipeline",
}
