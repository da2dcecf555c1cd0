"""Sharded snapshots: weights and optimizer through torch.distributed.checkpoint (DCP).

A multi-process run writes the same snapshot directory as a single process, except:

=========================  ==============================================================
``model_dcp/``             DCP directory of the model state (each rank's FSDP shards)
``optimizer_dcp/``         DCP directory of the optimizer tensors, keyed ``{fqn}/{name}``
``optimizer.json``         param groups with parameter *names* (FQNs) + non-tensor state
``{name}_dcp/``            extra tensor sets, e.g. ``ema_dcp/``
``rng_rank{r}.*``          each rank's RNG streams (safetensors + JSON), one pair per rank
=========================  ==============================================================

MANIFEST.json lists every file inside the DCP directories too, so the usual verification
covers them. DCP writes with its Hugging Face storage layer: every rank writes one
safetensors file per DCP directory whose header records the offsets of its shards, and the
reader rebuilds the global layout from those headers. There is no ``.metadata`` pickle
(DCP's default file-system layout writes one) and only tensors are stored (DCP loads
non-tensor values by unpickling them; we never give it any). Loading
into differently sharded templates is DCP's resharding: a snapshot written by W ranks
resumes on any world size.

Writing (collective, :func:`write_sharded_snapshot`): rank 0 prepares the hidden temporary
sibling and tells every rank its path; all ranks write their shards and RNG files into it;
after a barrier rank 0 hashes everything, writes the JSON files and the manifest, and
renames the directory into place (the usual atomic publication). :mod:`.restore` reads it
back, in one process too (:func:`read_dcp` consolidates full tensors).
"""

from __future__ import annotations

import logging
import shutil
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..device import flagged_ranks
from ..errors import CheckpointError
from ..fsio import file_sha256
from .contents import (
    CONFIG_FILE,
    DCP_SUFFIX,
    MODEL_DCP,
    OPTIMIZER_DCP,
    OPTIMIZER_JSON,
    TRAINER_STATE,
    check_snapshot_contents,
    prepare_snapshot_tmp,
    rng_names,
)
from .fsutil import fsync_dir, publish_dir
from .manifest import MANIFEST_NAME, manifest_bytes, write_bytes_file
from .tensorio import dumps_json, split_tree, write_safetensors

log = logging.getLogger(__name__)

KEY_SEP = "/"  # optimizer tensor keys: "{parameter fqn}/{state name}" (fqns hold no "/")


# --------------------------------------------------------------------------- DCP I/O


def _dcp() -> Any:
    """``torch.distributed.checkpoint``, imported on first use: it costs ~2 s, which the
    unsharded snapshots (every 1-process run) never need."""
    import torch.distributed.checkpoint as dcp  # lazy: see the docstring

    return dcp


def _check_tensors(tensors: Mapping[str, Any], where: str) -> None:
    for key, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{where}: '{key}' is a {type(value).__name__}; only tensors "
                                  "go into DCP (non-tensor state belongs in the JSON files)")


def save_dcp(tensors: Mapping[str, torch.Tensor], directory: Path) -> None:
    """Write ``tensors`` (DTensors and replicated tensors) to a DCP directory.

    Collective when a process group is up: every rank calls it with its own shards.
    """
    dcp = _dcp()
    _check_tensors(tensors, str(directory))
    writer = dcp.HuggingFaceStorageWriter(str(directory), save_distributed=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.save(dict(tensors), storage_writer=writer, no_dist=not dist.is_initialized())


def _reader(directory: Path) -> Any:
    if not directory.is_dir():
        raise CheckpointError(f"DCP directory {directory} is missing; the snapshot is "
                              "incomplete, resume from another one")
    return _dcp().HuggingFaceStorageReader(str(directory))


def dcp_layout(directory: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``{key: (global shape, dtype)}`` of a DCP directory (from its safetensors headers)."""
    meta = _reader(directory).read_metadata()
    return {key: (tuple(m.size), m.properties.dtype)
            for key, m in meta.state_dict_metadata.items()}


def load_dcp(tensors: dict[str, torch.Tensor], directory: Path) -> None:
    """Fill ``tensors`` in place from a DCP directory, resharding to their layout.

    Collective when a process group is up (each rank passes its own shards as templates).
    CheckpointError names the keys the directory lacks or whose shape differs.
    """
    _check_tensors(tensors, str(directory))
    layout = dcp_layout(directory)
    missing = sorted(set(tensors) - set(layout))
    wrong = sorted(k for k in set(tensors) & set(layout)
                   if tuple(tensors[k].shape) != layout[k][0])
    if missing or wrong:
        raise CheckpointError(f"{directory} does not fit (missing {missing[:6]}, shape differs "
                              f"{wrong[:6]}); resume with the snapshot's model config")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        _dcp().load(tensors, storage_reader=_reader(directory), no_dist=not dist.is_initialized())


def read_dcp(directory: Path, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of a DCP directory, consolidated to its full shape, without any
    process group (evaluation, export, a 1-process resume)."""
    full = {key: torch.empty(shape, dtype=dtype)
            for key, (shape, dtype) in sorted(dcp_layout(directory).items())}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        _dcp().load(full, storage_reader=_reader(directory), no_dist=True)
    return {k: v.to(device) for k, v in full.items()}


# --------------------------------------------------------------------------- optimizer keys


def flatten_optimizer_state(state: Mapping[str, Mapping[str, Any]]
                            ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """``{fqn: {name: value}}`` → (``{"fqn/name": tensor}``, non-tensor values by fqn)."""
    tensors: dict[str, torch.Tensor] = {}
    other: dict[str, dict[str, Any]] = {}
    for fqn, entries in state.items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{fqn}{KEY_SEP}{name}"] = value
            else:
                other.setdefault(fqn, {})[name] = value
    return tensors, other


def unflatten_optimizer_state(tensors: Mapping[str, torch.Tensor],
                              other: Mapping[str, Mapping[str, Any]]
                              ) -> dict[str, dict[str, Any]]:
    """Inverse of :func:`flatten_optimizer_state`."""
    state: dict[str, dict[str, Any]] = {fqn: dict(v) for fqn, v in other.items()}
    for key, value in tensors.items():
        fqn, name = key.rsplit(KEY_SEP, 1)
        state.setdefault(fqn, {})[name] = value
    return state


def optimizer_by_index(doc: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
                       source: str) -> dict[str, Any]:
    """A sharded snapshot's optimizer (names) in ``optimizer.state_dict()`` form (indices).

    torch numbers parameters by their position across the param groups, which is exactly
    the order of the names in ``doc["param_groups"]``.
    """
    try:
        order = [fqn for group in doc["param_groups"] for fqn in group["params"]]
        index = {fqn: i for i, fqn in enumerate(order)}
        by_name = unflatten_optimizer_state(tensors, doc.get("state_other") or {})
        state = {index[fqn]: entries for fqn, entries in by_name.items()}
        groups = [{**g, "params": [index[f] for f in g["params"]]} for g in doc["param_groups"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source} does not match its optimizer tensors ({exc!r}); the "
                              "snapshot is corrupted, resume from another one") from None
    return {"state": dict(sorted(state.items())), "param_groups": groups}


# --------------------------------------------------------------------------- writing


def write_sharded_snapshot(
    out_dir: str | Path,
    *,
    rank: int,
    device: torch.device,
    model_state: Mapping[str, torch.Tensor],
    optimizer_tensors: Mapping[str, torch.Tensor],
    optimizer_doc: Mapping[str, Any],
    trainer_state: Mapping[str, Any],
    rng_state: Mapping[str, Any],
    config_yaml: str,
    extra_sharded: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    extra_files: Mapping[str, bytes | str] | None = None,
) -> Path:
    """Collective: write a sharded snapshot to ``out_dir`` atomically (see module doc).

    Every rank passes its own shards (``model_state``, ``optimizer_tensors`` keyed
    ``{fqn}/{name}``, ``extra_sharded``) and RNG state; the JSON parts are taken from
    rank 0. All ranks return once the snapshot is published, or all raise CheckpointError.
    """
    out_dir = Path(out_dir)
    extra_sharded = dict(extra_sharded or {})
    extra_files = dict(extra_files or {})
    started = time.perf_counter()
    tmp = _agreed_tmp(out_dir, rank, device, trainer_state, extra_sharded, extra_files)
    problem = ""
    try:
        save_dcp(model_state, tmp / MODEL_DCP)
        save_dcp(optimizer_tensors, tmp / OPTIMIZER_DCP)
        for name, tensors in sorted(extra_sharded.items()):
            save_dcp(tensors, tmp / f"{name}{DCP_SUFFIX}")
        rng_doc, rng_tensors = split_tree(dict(rng_state), "rng.json")
        rng_st, rng_js = rng_names(rank)
        write_safetensors(tmp / rng_st, rng_tensors, role="rng_tensors")
        write_bytes_file(tmp / rng_js, dumps_json(rng_doc), "rng_json")
    except (OSError, CheckpointError, _dcp().CheckpointException) as exc:
        problem = f"cannot write snapshot {out_dir} on rank {rank}: {exc}; check free space"
    _agree(problem, device)  # also the barrier: every rank's files are in place
    if rank == 0:
        try:
            records = _finish_on_rank0(tmp, out_dir, optimizer_doc, trainer_state, config_yaml,
                                       extra_files)
            log.info("wrote sharded snapshot %s (%.1f MB in %.2f s)", out_dir,
                     sum(r["size"] for r in records.values()) / 1e6,
                     time.perf_counter() - started)
        except (OSError, CheckpointError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            problem = f"cannot write snapshot {out_dir}: {exc}; check free space and permissions"
    _agree(problem, device)
    return out_dir


def _agreed_tmp(out_dir: Path, rank: int, device: torch.device,
                trainer_state: Mapping[str, Any], extra_sharded: Mapping[str, Any],
                extra_files: Mapping[str, bytes | str]) -> Path:
    """Collective: rank 0 checks the contents and prepares the temporary snapshot directory;
    every rank gets its path, or all raise CheckpointError."""
    problem, tmp_text = "", ""
    if rank == 0:
        try:
            check_snapshot_contents(trainer_state, [f"{n}{DCP_SUFFIX}" for n in extra_sharded],
                                    extra_files)
            tmp_text = str(prepare_snapshot_tmp(out_dir))
        except CheckpointError as exc:
            problem = str(exc)
    _agree(problem, device)
    return Path(_broadcast_text(tmp_text, device))


def _finish_on_rank0(tmp: Path, out_dir: Path, optimizer_doc: Mapping[str, Any],
                     trainer_state: Mapping[str, Any], config_yaml: str,
                     extra_files: Mapping[str, bytes | str]) -> dict[str, dict[str, Any]]:
    """Hash what all ranks wrote, add the JSON files and the manifest, publish."""
    records: dict[str, dict[str, Any]] = {}
    for sub in sorted(p for p in tmp.iterdir() if p.is_dir()):
        role = {MODEL_DCP: "model_dcp", OPTIMIZER_DCP: "optimizer_dcp"}.get(sub.name, "extra_dcp")
        fsync_dir(sub)
        for f in sorted(sub.iterdir()):
            records[f"{sub.name}/{f.name}"] = {"size": f.stat().st_size,
                                               "sha256": file_sha256(f), "role": role}
    for f in sorted(tmp.glob("rng_rank*")):
        role = "rng_tensors" if f.suffix == ".safetensors" else "rng_json"
        records[f.name] = {"size": f.stat().st_size, "sha256": file_sha256(f), "role": role}
    opt_doc, opt_tensors = split_tree(dict(optimizer_doc), OPTIMIZER_JSON)
    assert not opt_tensors, "optimizer tensors go through DCP"
    records[OPTIMIZER_JSON] = write_bytes_file(tmp / OPTIMIZER_JSON, dumps_json(opt_doc),
                                               "optimizer_json")
    records[TRAINER_STATE] = write_bytes_file(tmp / TRAINER_STATE, dumps_json(trainer_state),
                                              "trainer_state")
    records[CONFIG_FILE] = write_bytes_file(tmp / CONFIG_FILE, config_yaml, "config")
    for name, data in sorted(extra_files.items()):
        records[name] = write_bytes_file(tmp / name, data, "extra_file")
    write_bytes_file(tmp / MANIFEST_NAME, manifest_bytes(records), "manifest")
    publish_dir(tmp, out_dir)
    return records


def _agree(problem: str, device: torch.device) -> None:
    """Collective: CheckpointError on every rank when any rank has a ``problem`` (the
    lowest such rank's message is raised everywhere); otherwise a barrier."""
    bad = flagged_ranks(bool(problem), device)
    if bad:
        raise CheckpointError(_broadcast_text(problem, device, src=bad[0]))


def _broadcast_text(text: str, device: torch.device, src: int = 0) -> str:
    """Rank ``src``'s string on every rank (UTF-8 bytes in a tensor: no pickle)."""
    blob = text.encode() if dist.get_rank() == src else b""
    size = torch.tensor([len(blob)], dtype=torch.int64, device=device)
    dist.broadcast(size, src)
    n = int(size.item())
    if n == 0:
        return ""
    buf = torch.zeros(n, dtype=torch.uint8, device=device)
    if dist.get_rank() == src:
        buf.copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
    dist.broadcast(buf, src)
    return bytes(buf.cpu().tolist()).decode()
