"""What every stage checks before it writes anything (torch-free)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...output_paths import Output, check_output_location, check_outputs
from ...spec.config import Config
from ...tracking.health import check_store


def step_name(step: int | None) -> str:
    """A snapshot's name in child run names: ``step_0000300``, or ``final``."""
    return "final" if step is None else f"step_{step:07d}"


def check_stage_outputs(cfg: Config, run_dir: Path, files: Sequence[tuple[Path | None, Any]] = (),
                        inputs: Sequence[tuple[str, Path]] = ()) -> None:
    """Before a stage's work: every output file (path, :class:`~pipeline_lib.output_paths.
    OutputKind`) passes the output rule against the stage's ``inputs``
    (:func:`pipeline_lib.output_paths.check_outputs`), and with tracking on the run
    directory can take tracking.json and the outbox and the store is the one tracking.json
    expects (:func:`pipeline_lib.tracking.health.check_store`). One line each, nothing
    written."""
    check_outputs([Output(Path(path), "output", kind) for path, kind in files
                   if path is not None], [(what, Path(p)) for what, p in inputs])
    if cfg.tracking.enabled:
        check_output_location(Path(run_dir), "run directory (tracking)")
        check_store(cfg, Path(run_dir))
