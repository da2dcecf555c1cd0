"""Where the torchruns of a multi-node segment meet: the c10d rendezvous, and the one line
that says why it never completed.

The endpoint is ``train.rdzv_endpoint`` when set, else ``$MASTER_ADDR:$MASTER_PORT`` when
exported, else (inside a SLURM allocation) derived from the allocation as torchtitan's and
OLMo-core's SLURM launchers do: the host is the first node of the job's node list, by its
``NodeAddr`` (the address SLURM itself reaches the node at: ``scontrol show node``), and the
port is ``20000 + job id mod 20000``, so two jobs that share a node meet on different ports.
The Snakemake executor plugin strips ``SLURM_JOB_NODELIST`` from a job's environment (it keeps
``SLURM_JOB_ID``), so the node list is read from ``scontrol show job`` when it is missing.

A node that never starts torchrun (or cannot reach the endpoint) leaves the others waiting:
torchrun gives up after ``train.rdzv_timeout_s`` (its ``join_timeout``), and
:func:`rendezvous_failure` turns its output into one line naming the nodes that did not join.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..errors import ConfigError

log = logging.getLogger(__name__)

RDZV_BASE_PORT = 20000  # derived ports lie in [20000, 40000): above the well-known ones
_LABEL = re.compile(r"^\s*(\d+): ")  # srun --label: the task number (= node index here)
_TIMEOUT = "RendezvousTimeoutError"


@dataclass(frozen=True)
class Rendezvous:
    """One segment job's rendezvous: ``endpoint`` host:port, how many nodes meet there, the
    job's ``nodes`` in SLURM's order (empty outside an allocation) and how long torchrun
    waits for them."""

    endpoint: str
    nnodes: int
    nodes: tuple[str, ...]
    timeout_s: int


def rendezvous_port(job_id: str) -> int:
    """The derived rendezvous port of SLURM job ``job_id``."""
    return RDZV_BASE_PORT + int(job_id) % RDZV_BASE_PORT


def _scontrol(*args: str) -> str:
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"scontrol {' '.join(args)} failed ({exc}); set train.rdzv_endpoint: "
                          "HOST:PORT (a node of the job)") from None
    if done.returncode != 0:
        raise ConfigError(f"scontrol {' '.join(args)} failed: {done.stderr.strip()}; set "
                          "train.rdzv_endpoint: HOST:PORT (a node of the job)")
    return done.stdout


def _field(record: str, key: str) -> str:
    """``key``'s value in one ``scontrol show … -o`` record (``Key=value`` words)."""
    for word in record.split():
        name, _, value = word.partition("=")
        if name == key:
            return value
    return ""


def job_nodes(env: Mapping[str, str], *, now: bool = False) -> tuple[str, ...]:
    """The nodes of the allocation in ``env`` (``SLURM_JOB_ID``), in SLURM's order; ``now``:
    as SLURM holds them now (``$SLURM_JOB_NODELIST`` keeps the nodes the job began with)."""
    nodelist = "" if now else env.get("SLURM_JOB_NODELIST", "")
    nodelist = nodelist or _field(_scontrol("show", "job", "-o", env["SLURM_JOB_ID"]),
                                  "NodeList")
    return tuple(_scontrol("show", "hostnames", nodelist).split())


def node_address(node: str) -> str:
    """The address SLURM reaches ``node`` at (its ``NodeAddr``; the name when unset)."""
    return _field(_scontrol("show", "node", "-o", node), "NodeAddr") or node


def resolve_rendezvous(endpoint: str, nnodes: int, timeout_s: int,
                       env: Mapping[str, str]) -> Rendezvous:
    """The rendezvous of a job of ``nnodes`` nodes: ``endpoint`` (``train.rdzv_endpoint``)
    when set, else ``$MASTER_ADDR:$MASTER_PORT``, else derived from the SLURM allocation."""
    if not endpoint and env.get("MASTER_ADDR"):
        endpoint = f"{env['MASTER_ADDR']}:{env.get('MASTER_PORT', '29500')}"
    if endpoint:  # the nodes only name the missing ones should the rendezvous fail
        return Rendezvous(endpoint, nnodes, _nodes_if_known(env), timeout_s)
    if not env.get("SLURM_JOB_ID"):
        raise ConfigError(f"train.nnodes = {nnodes} outside a SLURM allocation needs a "
                          "rendezvous address: set train.rdzv_endpoint: HOST:PORT (a node of "
                          "the job) or export MASTER_ADDR/MASTER_PORT")
    nodes = job_nodes(env)
    return Rendezvous(f"{node_address(nodes[0])}:{rendezvous_port(env['SLURM_JOB_ID'])}",
                      nnodes, nodes, timeout_s)


def after_node_loss(rdzv: Rendezvous, endpoint: str, min_nnodes: int,
                    env: Mapping[str, str]) -> Rendezvous | None:
    """The rendezvous of the nodes left in the job when some of ``rdzv.nodes`` failed and
    SLURM took them out of the allocation (a ``--no-kill`` job), provided at least
    ``min_nnodes`` are left; None otherwise (no node lost, too few left, outside SLURM).
    ``endpoint``: ``train.rdzv_endpoint`` (empty: derived again, from the first node left)."""
    if not (min_nnodes and rdzv.nodes and env.get("SLURM_JOB_ID")):
        return None
    try:
        left = job_nodes(env, now=True)
    except ConfigError as exc:
        log.warning("the job's nodes after the failure are unknown: %s", exc)
        return None
    if set(rdzv.nodes) <= set(left) or len(left) < min_nnodes:
        return None
    return resolve_rendezvous(endpoint, len(left), rdzv.timeout_s,
                              {**env, "SLURM_JOB_NODELIST": ",".join(left)})


def _nodes_if_known(env: Mapping[str, str]) -> tuple[str, ...]:
    if not env.get("SLURM_JOB_ID"):
        return ()
    try:
        return job_nodes(env)
    except ConfigError as exc:  # best effort: the endpoint is known without them
        log.warning("the job's nodes are unknown: %s", exc)
        return ()


def rendezvous_failure(rdzv: Rendezvous, lines: Iterable[str]) -> str | None:
    """The one line of a rendezvous that timed out (None when it did not): the nodes that
    did not join, known from srun's ``--label`` (a node whose torchrun waited and timed out
    says so under its task number), and the timeout."""
    waited: set[int] = set()
    timed_out = False
    for line in lines:
        if _TIMEOUT in line:
            timed_out = True
            label = _LABEL.match(line)
            if label:
                waited.add(int(label.group(1)))
    if not timed_out:
        return None
    missing = [n for i, n in enumerate(rdzv.nodes) if i not in waited]
    if rdzv.nodes and waited and missing:
        who = f"{', '.join(missing)} did not join"
    else:
        who = f"fewer than {rdzv.nnodes} nodes joined"
    return (f"the rendezvous at {rdzv.endpoint} did not complete within {rdzv.timeout_s} s: "
            f"{who} (a node whose torchrun did not start, or that cannot reach "
            f"{rdzv.endpoint}; train.rdzv_timeout_s sets the wait)")
