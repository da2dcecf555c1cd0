"""The comparison of finished runs (rule ``compare_runs``, command ``compare``): table,
summary, depth check and plots of every variant side by side.

No child run of its own: a comparison belongs to no single variant's parent run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...compare import check_compare_outputs, compare_runs, run_dir_inputs


def compare_stage(runs: Mapping[str, Path | Mapping[str, Path]], out_dir: Path,
                  depth_json: Path | None = None) -> list[dict[str, Any]]:
    """Compare ``runs`` into ``out_dir`` (the depth check into ``depth_json``, default
    ``out_dir/depth_check.json``); returns the table rows. ``runs``: run → its input files
    (as :func:`pipeline_lib.compare.compare_runs` takes them), or its run directory
    (results/<run>), where they are found once the outputs are known to be writable."""
    check_compare_outputs(Path(out_dir), depth_json)  # before any run directory is read
    inputs = {run: run_dir_inputs(files) if isinstance(files, Path) else files
              for run, files in runs.items()}
    return compare_runs(inputs, Path(out_dir), depth_json)
