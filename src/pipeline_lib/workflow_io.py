"""Small helpers for the Snakemake scripts in workflow/scripts."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import PipelineError


@contextlib.contextmanager
def script_logging(log_path: str | Path, level: int = logging.INFO) -> Iterator[logging.Logger]:
    """Send logging, warnings and tqdm (stderr) of a rule's script to its ``log:`` file.

    A :class:`PipelineError` is logged as one line and re-raised as ``SystemExit`` with that
    line, so the Snakemake error report shows the fix rather than a traceback.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", buffering=1) as stream:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(level)
        logging.captureWarnings(True)
        old_stderr = sys.stderr
        sys.stderr = stream
        try:
            yield logging.getLogger("pipeline_lib.script")
        except PipelineError as exc:
            logging.getLogger("pipeline_lib.script").error("%s", exc)
            raise SystemExit(f"error: {exc} (log: {log_path})") from None
        finally:
            sys.stderr = old_stderr
            root.removeHandler(handler)


def run_config(snakemake: Any):
    """The resolved config of the rule's ``params.run`` variant (total_steps filled in)."""
    from .workflow_plan import WorkflowPlan

    return WorkflowPlan(snakemake.config).runs[snakemake.params.run].config
