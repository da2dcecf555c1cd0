"""Small helpers for the Snakemake scripts in workflow/scripts."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import PREEMPTED_EXIT, ConfigError, PipelineError, Preempted
from ..spec.config import Config
from ..spec.config_load import config_from_dict
from ..spec.run_spec import RunSpec, SpecRef, read_run_spec, spec_path
from .attempt_log import open_attempt_log


def limit_threads(threads: int) -> None:
    """At most ``threads`` compute threads in this process (torch) and its children (OMP)."""
    os.environ["OMP_NUM_THREADS"] = str(max(threads, 1))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(max(threads, 1))


@contextlib.contextmanager
def script_logging(log_path: str | Path, threads: int | None = None,
                   level: int = logging.INFO) -> Iterator[logging.Logger]:
    """Send logging, warnings and tqdm (stderr) of a rule's script to its ``log:`` file.

    ``threads`` (the rule's ``threads:``, which Snakemake caps at ``--cores``) bounds torch's
    intra-op threads and those of child processes: two jobs on two cores must not each
    start a thread per core.

    A :class:`PipelineError` is logged as one line and re-raised as ``SystemExit`` with that
    line, so the Snakemake error report shows the fix rather than a traceback. A stopped
    segment (:class:`Preempted`: a resume point was written) prints ``stopped: …`` and exits
    75 (:data:`PREEMPTED_EXIT`), as the ``train`` command does.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if threads is not None:
        limit_threads(int(threads))
    with open_attempt_log(log_path) as stream:  # a retry keeps attempt 1's log
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
        except Preempted as exc:
            logging.getLogger("pipeline_lib.script").warning("stopped: %s", exc)
            print(f"stopped: {exc} (log: {log_path})", file=old_stderr)
            raise SystemExit(PREEMPTED_EXIT) from None
        except PipelineError as exc:
            logging.getLogger("pipeline_lib.script").error("%s", exc)
            raise SystemExit(f"error: {exc} (log: {log_path})") from None
        finally:
            sys.stderr = old_stderr
            root.removeHandler(handler)


def run_spec(snakemake: Any) -> RunSpec:
    """The rule's run as the plan that made the job resolved it: the spec file its
    ``params.spec`` names (``{params.run_dir}/specs/{digest}.yaml``, verified against the
    digest; no job plans the experiment again), with the credentials of ``tracking.uri``
    put back from the job's config. ConfigError (one line) before any work when the file is
    not that spec or not the run's."""
    ref = getattr(snakemake.params, "spec", None)
    if not isinstance(ref, SpecRef) or ref.run != snakemake.params.run:
        raise ConfigError(f"rule {getattr(snakemake, 'rule', '?')} gives no spec of run "
                          f"{snakemake.params.run!r} in params.spec ({ref!r}); every rule "
                          "of a run's job passes PLAN.spec_ref(run)")
    spec = read_run_spec(snakemake.params.run_dir, ref.digest)
    if spec.name != ref.run:
        raise ConfigError(f"{spec_path(snakemake.params.run_dir, ref.digest)} is the spec of "
                          f"run {spec.name!r}, not of {ref.run!r}; point the run's params.run_dir "
                          "at its own run directory")
    return spec.with_tracking_uri(_tracking_uri(snakemake.config, spec.name))


def _tracking_uri(config: Any, run: str) -> str | None:
    """``tracking.uri`` as the job's config gives it (the variant's first), credentials
    included; None when it gives none."""
    runs = config.get("runs") if isinstance(config, dict) else None
    variant = runs.get(run) if isinstance(runs, dict) else None
    for section in (variant, config):
        tracking = section.get("tracking") if isinstance(section, dict) else None
        uri = tracking.get("uri") if isinstance(tracking, dict) else None
        if isinstance(uri, str) and uri:
            return uri
    return None


def run_config(snakemake: Any) -> Config:
    """The completed config of the rule's ``params.run`` variant (:func:`run_spec`)."""
    return run_spec(snakemake).config


@contextlib.contextmanager
def run_job(snakemake: Any, threads: int | None = None, *,
            opens_parent: bool = True) -> Iterator[Config]:
    """A job of one run's pipeline: :func:`script_logging`, the run's resolved config (yielded),
    and its MLflow parent run RUNNING while the job runs, FAILED if it fails
    (:func:`pipeline_lib.tracking.pipeline_job`); not with ``opens_parent=False``, the job
    that ends the parent run (rule ``track_done``)."""
    from ..tracking import pipeline_job  # ~0.2 s of imports that script_logging's users skip

    with script_logging(snakemake.log[0], threads):
        cfg = run_config(snakemake)
        parent = pipeline_job(cfg, Path(snakemake.params.run_dir)) if opens_parent else None
        with parent or contextlib.nullcontext():
            yield cfg


@contextlib.contextmanager
def config_job(snakemake: Any, sections: dict[str, Any]) -> Iterator[Config]:
    """A job of no one run (the shared pack, the tracking store): :func:`script_logging` and
    the config of ``sections`` (a dict of config sections), yielded."""
    with script_logging(snakemake.log[0]):
        yield config_from_dict(sections)
