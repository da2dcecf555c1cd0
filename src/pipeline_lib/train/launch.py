"""Launch one training segment: in this process, or as a torchrun job of ``train.nproc``.

:func:`run_training_job` is what the ``train`` stage calls
(:func:`pipeline_lib.workflow.stages.train.train_stage`: rule ``train_segment`` and the
``train`` command). With one process it runs
:func:`~.job.train_segment` here. With ``train.nproc`` > 1 (or ``train.nnodes`` > 1)
it writes the resolved config into the run directory (shared storage: every node's workers
read it; :meth:`RunLayout.launch_config`) and runs PyTorch's own launcher::

    python -m torch.distributed.run --standalone --nproc_per_node N \\
        -m pipeline_lib train --config resolved.yaml --data … --until-step … --attempt K

``--standalone`` starts the rendezvous store on ``localhost:0``: the kernel hands every job
a free port, so concurrent segment jobs on one machine never collide (torchrun ignores
``--master_port`` in this mode). With ``train.nnodes`` > 1 the job uses a c10d rendezvous
(:mod:`.rendezvous`: ``train.rdzv_endpoint``, or derived from the SLURM allocation) and,
inside a SLURM allocation, ``srun --label`` starts one torchrun per node (the rule asks SLURM
for the nodes: see :func:`pipeline_lib.workflow.cluster_resources.multi_node_resources`). The
job's output is streamed into this process's log; a failure raises TrainingError carrying the
failing rank's error line, or the nodes a rendezvous waited for in vain. A node that fails
mid-segment ends the job, which SLURM requeues; with ``train.min_nnodes`` the job survives it
(``--no-kill``) and runs the segment again from its input on the nodes left, when enough are.

In the worker processes the ``train`` command calls :func:`train_in_process`, which sees
torchrun's environment, joins the process group and trains its rank.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PipelineError, Preempted, TrainingError
from ..fsio import write_text_atomic
from ..spec.config import Config
from ..spec.config_write import config_yaml
from ..spec.layout import RunLayout, run_dir_of
from ..tracking import resolve_uri
from .distributed import destroy_process_group, init_process_group, launched_by_torchrun
from .finished import adopt_finished, drop_consumed
from .job import check_segment_outputs, train_segment
from .lease import run_lease
from .preempt import STOP_SIGNALS, latched_signal
from .rendezvous import Rendezvous, after_node_loss, rendezvous_failure, resolve_rendezvous
from .run_tracking import SegmentTracking
from .segment_start import segment_signature, snapshot_step, stop_record

if TYPE_CHECKING:  # only a type here; the teacher is built in the segment job
    from .distill import SourceBuilder

log = logging.getLogger(__name__)
job_log = logging.getLogger("pipeline_lib.torchrun")

_RANK_PREFIX = re.compile(r"^\[(?:default)?(?:rank)?(\d+)\]:\s?(.*)$")
_ERROR_LINE = re.compile(r"\b(error: .+|\w*(?:Error|Exception): .+)$")


def job_rendezvous(cfg: Config, env: Mapping[str, str] | None = None) -> Rendezvous | None:
    """The rendezvous of a multi-node segment (None on one node: ``--standalone``)."""
    t = cfg.train
    if t.nnodes == 1:
        return None
    return resolve_rendezvous(t.rdzv_endpoint, t.nnodes, t.rdzv_timeout_s,
                              os.environ if env is None else env)


def rendezvous_args(rdzv: Rendezvous | None, env: Mapping[str, str] | None = None,
                    job_id: str = "") -> list[str]:
    """torchrun's rendezvous options: standalone on one node, c10d across several."""
    if rdzv is None:
        return ["--standalone", "--nnodes", "1"]
    env = os.environ if env is None else env
    rdzv_id = env.get("SLURM_JOB_ID") or job_id or "loopline"
    return ["--nnodes", str(rdzv.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint",
            rdzv.endpoint, "--rdzv-id", rdzv_id, "--rdzv-conf", f"join_timeout={rdzv.timeout_s}"]


def torchrun_command(cfg: Config, train_args: Iterable[str], *, rdzv: Rendezvous | None = None,
                     env: Mapping[str, str] | None = None, job_id: str = "") -> list[str]:
    """The command line of a multi-process segment (``srun`` first across SLURM nodes);
    ``rdzv``: :func:`job_rendezvous`'s (None on one node), or the smaller one of the nodes
    left after a node failed (:func:`~.rendezvous.after_node_loss`)."""
    env = os.environ if env is None else env
    t, r = cfg.train, cfg.resources
    cmd = [sys.executable, "-m", "torch.distributed.run", *rendezvous_args(rdzv, env, job_id),
           "--nproc_per_node", str(t.nproc), "-m", "pipeline_lib", "train", *train_args]
    if rdzv is not None and env.get("SLURM_JOB_ID") and shutil.which("srun"):
        # one torchrun per node, holding what the job holds on each node for its nproc workers
        # (the executor plugin strips SLURM_CPUS_ON_NODE & co. from the job: from the config,
        # as cluster_resources.multi_node_resources asked for them); --label: node by node
        cpus = max(1, r.train_cpus // t.nproc) * t.nproc
        gres = [f"--gres=gpu:{r.train_gpus}"] if r.train_gpus else []
        cmd = ["srun", f"--nodes={rdzv.nnodes}", "--ntasks-per-node=1", f"--cpus-per-task={cpus}",
               f"--ntasks={rdzv.nnodes}", *gres, "--kill-on-bad-exit=1", "--label", *cmd]
    return cmd


def _train_args(config_path: Path, data_dir: Path, resume_from: Path | None, until_step: int,
                out: Path, run_dir: Path | None, attempt: int,
                warm_start: Path | None, *, tracked: bool = True) -> list[str]:
    args = ["--config", str(config_path), "--data", str(Path(data_dir).resolve()),
            "--resume-from", "none" if resume_from is None else str(Path(resume_from).resolve()),
            "--until-step", str(until_step), "--out", str(Path(out).resolve()),
            "--attempt", str(attempt)]
    if run_dir is not None:
        args += ["--run-dir", str(Path(run_dir).resolve())]
    if warm_start is not None:
        args += ["--warm-start", str(Path(warm_start).resolve())]
    if not tracked:
        args.append("--no-track")
    return args


def failure_line(lines: Iterable[str]) -> str | None:
    """The most telling error line of a failed job: the first one-line PipelineError a
    worker printed (``error: rank R: …``), else the last exception line of a traceback
    (torch prefixes those with ``[rankR]:``), naming its rank."""
    found: list[tuple[int, str]] = []
    for raw in lines:
        m = _RANK_PREFIX.match(raw.strip())
        rank, text = (f"rank {m.group(1)}: ", m.group(2)) if m else ("", raw.strip())
        e = _ERROR_LINE.search(text)
        if e:
            line = e.group(1)
            pipeline = line.startswith("error: ")
            found.append((0 if pipeline else 1, rank + line.removeprefix("error: ")))
    if not found:
        return None
    pipeline_lines = [line for kind, line in found if kind == 0]
    return pipeline_lines[0] if pipeline_lines else found[-1][1]


def run_training_job(cfg: Config, data_dir: Path, resume_from: Path | None, until_step: int,
                     out: Path, run_dir: Path | None = None, attempt: int = 1, *,
                     warm_start: Path | None = None,
                     tracking: SegmentTracking | None = None,
                     build_source: SourceBuilder | None = None) -> Path:
    """Train one segment with ``train.nproc`` × ``train.nnodes`` processes; returns ``out``.
    The run's training lease (:mod:`.lease`) is held throughout: a second job of the run
    waits for the first to end. Holding it, the job adopts the segment when an earlier job
    of it finished unseen (:func:`.finished.adopt_finished`) rather than training it again.
    ``tracking``: see :func:`.job.train_segment` (the workers of a multi-process job are
    ``train`` commands, tracked unless it is None)."""

    check_segment_outputs(out, run_dir)  # before torchrun starts (or anything is built)
    home = Path(run_dir or run_dir_of(Path(out)))
    signature = segment_signature(cfg, data_dir)
    segment = {"input": None if resume_from is None else str(resume_from),
               "signature": signature, "out": str(out)}
    with run_lease(home, until_step, segment):
        drop_consumed(home, None if resume_from is None else snapshot_step(resume_from))
        if adopt_finished(home, resume_from, until_step, signature, Path(out)):
            return Path(out)
        return _train_job(cfg, data_dir, resume_from, until_step, out, run_dir, attempt,
                          signature, warm_start=warm_start, tracking=tracking, build_source=build_source)


def _train_job(cfg: Config, data_dir: Path, resume_from: Path | None, until_step: int,
               out: Path, run_dir: Path | None, attempt: int, signature: str, *,
               warm_start: Path | None, tracking: SegmentTracking | None,
               build_source: SourceBuilder | None) -> Path:

    if cfg.train.nproc == 1 and cfg.train.nnodes == 1:
        return train_segment(cfg, data_dir, resume_from, until_step, out, run_dir, attempt,
                             warm_start=warm_start, tracking=tracking, build_source=build_source)
    if cfg.tracking.enabled:
        resolve_uri(cfg)  # the URI's credentials into MLflow's variables, which workers inherit
    home = Path(run_dir or run_dir_of(Path(out)))
    config_path = RunLayout.at(home.resolve()).launch_config(until_step)
    config_path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(config_path, config_yaml(cfg))  # without credentials
    args = _train_args(config_path, data_dir, resume_from, until_step, out, run_dir, attempt,
                       warm_start, tracked=tracking is not None)
    stopped = functools.partial(_stopped_with_resume_point, home, until_step, attempt,
                                signature)
    try:
        rc, tail, rdzv = _run_workers(cfg, args, Path(out).name, stopped)
    finally:
        config_path.unlink(missing_ok=True)
    if rc != 0:
        reason = (rdzv and rendezvous_failure(rdzv, tail)
                  or failure_line(tail) or f"no error line in its output (exit status {rc})")
        if stopped():
            raise Preempted(reason.removeprefix("stopped: "))
        world = cfg.train.nproc * (rdzv.nnodes if rdzv else 1)
        raise TrainingError(f"{world}-process training to step {until_step} failed: {reason}; "
                            "the full output is in the job log")
    return Path(out)


def _run_workers(cfg: Config, args: list[str], job_id: str,
                 stopped: Callable[[], bool]) -> tuple[int, list[str], Rendezvous | None]:
    """Run the workers (torchrun, by ``srun`` on each node of a SLURM job); when a node
    failed and at least ``train.min_nnodes`` are left, run them again on those, from the
    segment's input as a new job of it would. (exit status, last lines, last rendezvous)."""
    rdzv = job_rendezvous(cfg)
    while True:
        cmd = torchrun_command(cfg, args, rdzv=rdzv, job_id=job_id)
        log.info("launching %d×%d processes: %s", rdzv.nnodes if rdzv else 1, cfg.train.nproc,
                 " ".join(cmd))
        rc, tail = _stream(cmd)
        smaller = (rc != 0 and rdzv is not None and not stopped()
                   and after_node_loss(rdzv, cfg.train.rdzv_endpoint, cfg.train.min_nnodes,
                                       os.environ))
        if not smaller:
            return rc, tail, rdzv
        lost = sorted(set(rdzv.nodes) - set(smaller.nodes))
        log.warning("%s failed and left the job; going on with the %d node(s) left (%s; "
                    "train.min_nnodes = %d): the segment again from its input, %d process(es)",
                    ", ".join(lost), smaller.nnodes, ", ".join(smaller.nodes),
                    cfg.train.min_nnodes, smaller.nnodes * cfg.train.nproc)
        rdzv = smaller


def _stopped_with_resume_point(run_dir: Path, until_step: int, attempt: int,
                               signature: str) -> bool:
    """Whether the workers stopped this attempt with a resume point (read, never removed:
    judging it is the next attempt's :func:`~.segment_start.segment_start`)."""
    record = stop_record(RunLayout.at(run_dir).resume_point(until_step))
    return (record is not None and int(record.get("attempt", 0)) == attempt
            and record.get("signature") == signature)


def _forward_stops(proc: subprocess.Popen) -> dict[int, Any]:
    """Pass SIGTERM/SIGUSR1 on to the workers (they stop after a step, with a resume point)
    instead of ending this launcher before them; returns the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
                for sig in STOP_SIGNALS}
    if latched_signal() is not None:  # it came before the workers existed
        proc.send_signal(latched_signal())
    return previous


def _stream(cmd: list[str], keep: int = 400) -> tuple[int, list[str]]:
    """Run ``cmd``, logging each output line as it comes; (exit status, last lines)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, bufsize=1) as proc:
        assert proc.stdout is not None
        previous = _forward_stops(proc)
        try:
            for line in proc.stdout:
                job_log.info("%s", line.rstrip("\n"))
                tail.append(line)
                del tail[:-keep]
        except BaseException:
            proc.terminate()  # Ctrl-C or a kill of this job ends the workers too
            proc.wait()
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return proc.returncode, tail


def train_in_process(cfg: Config, data_dir: Path, resume_from: Path | None, until_step: int,
                     out: Path, run_dir: Path | None = None, attempt: int = 1, *,
                     warm_start: Path | None = None,
                     tracking: SegmentTracking | None = None,
                     build_source: SourceBuilder | None = None) -> tuple[Path, int]:
    """The ``train`` stage's body in a worker: this process's share of the segment.

    Under torchrun it joins the process group (backend from ``experiment.device``), trains
    its rank and leaves the group; otherwise it trains alone. Returns (out, rank).
    """

    if not launched_by_torchrun():
        return train_segment(cfg, data_dir, resume_from, until_step, out, run_dir, attempt,
                             warm_start=warm_start, tracking=tracking, build_source=build_source), 0
    ctx = init_process_group(cfg.experiment.device)
    try:
        train_segment(cfg, data_dir, resume_from, until_step, out, run_dir, attempt,
                      world_size=ctx.world_size, rank=ctx.rank, warm_start=warm_start,
                      tracking=tracking, build_source=build_source)
    except PipelineError as exc:  # the CLI prints it as one line: say which rank
        raise type(exc)(f"rank {ctx.rank}: {exc}") from None
    finally:
        destroy_process_group()
    return Path(out), ctx.rank
