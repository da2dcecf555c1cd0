"""Cluster resources of the rule families: what each submitted job asks SLURM for.

Two families: ``train`` (segments and the pretrained import: ``resources.train_*``) and
``eval`` (every other submitted job: sweeps, benchmarks, export, packing, the index, the
summaries and the comparison: ``resources.eval_*``). ``slurm_partition`` and
``slurm_account`` reach every one of them. The rules take these dicts from
``workflow/rules/common.smk``; one rule's values are overridden with Snakemake's own
``set-resources`` (profile or command line). Names are the SLURM executor plugin's (it turns
them into ``sbatch`` options); local runs use only threads, ``mem_mb`` and ``runtime``.
Torch-free: the Snakefile's plan calls this.
"""

from __future__ import annotations

from typing import Any

from ..spec.config import Config


def job_threads(cfg: Config, family: str) -> int:
    """Threads of a ``train`` or ``eval`` job (Snakemake caps them at ``--cores``)."""
    r = cfg.resources
    return r.train_cpus if family == "train" else r.eval_cpus


def job_resources(cfg: Config, family: str) -> dict[str, Any]:
    """Resources of the ``train`` or ``eval`` rule family; partition and account only when
    set, so the cluster defaults apply otherwise. A segment's runtime and early signal come
    from :func:`segment_time` (they may differ between variants)."""
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
    else:
        res["runtime"] = cfg.train.segment_runtime_minutes
    if r.slurm_partition:
        res["slurm_partition"] = r.slurm_partition
    if r.slurm_account:
        res["slurm_account"] = r.slurm_account
    return res


def usr1_lead_seconds(cfg: Config) -> int:
    """Seconds before its time limit at which SLURM sends a segment job SIGUSR1: the
    segment's own stop margin (``train.stop_margin_minutes``), so that the trainer's clock
    and the scheduler's ask for the same stop; 0 (no early signal) when the margin is 0."""
    return round(cfg.train.stop_margin_minutes * 60)


def segment_time(cfg: Config) -> dict[str, Any]:
    """A segment job's ``runtime`` (minutes) and its ``slurm_extra``: with a stop margin,
    SIGUSR1 that long before the limit (``--signal=USR1@seconds``: to the job's steps, where
    the trainer runs; Snakemake inside the job ignores it); with ``train.min_nnodes`` below
    ``train.nnodes``, ``--no-kill``: a failed node leaves the job (SLURM takes it out of the
    allocation) rather than ending it, so the segment can go on with the nodes left
    (:mod:`pipeline_lib.train.launch`)."""
    t = cfg.train
    res: dict[str, Any] = {"runtime": t.segment_runtime_minutes}
    lead = usr1_lead_seconds(cfg)
    extra = [f"--signal=USR1@{lead}"] if lead else []
    if 0 < t.min_nnodes < t.nnodes:
        extra.append("--no-kill")
    if extra:
        res["slurm_extra"] = " ".join(extra)
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
