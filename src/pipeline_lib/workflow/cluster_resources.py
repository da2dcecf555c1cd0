"""Cluster resources of the rule families: what a segment or evaluation job asks SLURM for.

Names are the SLURM executor plugin's (it turns them into ``sbatch`` options); local runs
use only threads, ``mem_mb`` and ``runtime``. Torch-free: the Snakefile's plan calls this.
"""

from __future__ import annotations

from typing import Any

from ..config import Config


def job_threads(cfg: Config, family: str) -> int:
    """Threads of a ``train`` or ``eval`` job (Snakemake caps them at ``--cores``)."""
    r = cfg.resources
    return r.train_cpus if family == "train" else r.eval_cpus


def job_resources(cfg: Config, family: str) -> dict[str, Any]:
    """Resources of the ``train`` or ``eval`` rule family; partition and account only when
    set, so the cluster defaults apply otherwise."""
    r = cfg.resources
    res: dict[str, Any] = {
        "cpus_per_task": job_threads(cfg, family),
        "mem_mb": r.train_mem_mb if family == "train" else r.eval_mem_mb,
    }
    gpus = r.train_gpus if family == "train" else r.eval_gpus
    if family == "train" and cfg.train.nnodes > 1:
        res.update(multi_node_resources(cfg.train.nnodes, cfg.train.nproc, gpus, r.train_cpus))
    elif gpus:
        res["gpu"] = gpus
    if family != "train":
        res["runtime"] = r.eval_runtime_minutes
    if r.slurm_partition:
        res["slurm_partition"] = r.slurm_partition
    if r.slurm_account:
        res["slurm_account"] = r.slurm_account
    return res


def multi_node_resources(nnodes: int, nproc: int, gpus_per_node: int,
                         cpus_per_node: int) -> dict[str, Any]:
    """SLURM resources of a segment job over ``nnodes`` nodes of ``nproc`` processes each
    (names of the SLURM executor plugin, which turns them into ``sbatch`` options).

    ``nodes``, and one task per process (``tasks_per_node``; with one process per node
    ``tasks`` = nnodes, since the plugin refuses ``tasks_per_node`` 1 for these jobs);
    ``mpi`` makes the job step run the segment's command in the batch script rather than in
    ``srun -n1``, so that the segment's own ``srun`` can start one torchrun per node; GPUs per
    node as ``gres`` (``gpu`` would be the job's total), and ``tasks_per_gpu: 0`` so that the
    plugin does not read ``tasks`` as tasks per GPU. ``cpus_per_node`` is split over the tasks.
    """
    res: dict[str, Any] = {"nodes": nnodes, "mpi": "srun",
                           "cpus_per_task": max(1, cpus_per_node // nproc)}
    if nproc > 1:
        res["tasks_per_node"] = nproc
    else:
        res["tasks"] = nnodes
    if gpus_per_node:
        res.update(gres=f"gpu:{gpus_per_node}", tasks_per_gpu=0)
    return res
