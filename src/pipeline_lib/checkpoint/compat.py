"""May this snapshot be resumed under the current config? And the explicit warm start.

Exact resume restores weights, optimizer moments, RNG streams and the data cursor, so the
keys that give those states their meaning must be unchanged:

- ``data.*`` (all of it): the cursor (epoch, row) indexes rows of one specific pack;
- ``model.*`` except pure kernel choices that compute the same function
  (``model.attention``, ``model.loss_chunk_size``); ``model.vocab_size`` is compared only
  when both sides give it (0 means "from the tokenizer");
- ``train.optimizer`` (state layout), ``train.beta1``, ``train.beta2``, ``train.eps`` (the
  moments are estimates under these), ``train.global_batch_rows`` (a step's meaning: rows
  per step, tokens seen, where the cursor moves), ``train.freeze`` (which parameters have
  optimizer groups and state; compared as a set), and with ``train.optimizer = muon`` on
  both sides ``train.muon_momentum`` (the momentum buffers average under it).

Everything else may change between segments on purpose: ``total_steps`` (extend a run),
``steps_per_segment``, the schedule and peak lr, warmup, weight decay, grad clipping,
``nproc`` / ``micro_batch_rows`` (same global batch on another world size), loop sampling,
backprop mode, spike-guard thresholds, EMA, evaluation and tracking settings.

A deliberate change of the checked keys is a *warm start*: :func:`~.snapshot.load_weights_only`
copies the model weights and nothing else (optimizer, spike guard, RNG and cursor start
fresh), and the trainer records that it did so. Torch-free: the planner reads a teacher
snapshot's config through here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..data.tokenizer_identity import check_model_fits_pack
from ..errors import CheckpointError, ConfigError
from ..spec.config import Config
from ..spec.config_errors import omegaconf
from ..spec.config_load import config_from_dict, load_config
from ..spec.config_write import to_dict
from ..spec.names import TOKENIZER_FILE
from .contents import CONFIG_FILE
from .manifest import MANIFEST_NAME, describe_non_snapshot, verify_snapshot

log = logging.getLogger(__name__)

RESUME_MODEL_EXEMPT = frozenset({"model.attention", "model.loss_chunk_size"})
RESUME_TRAIN_KEYS = ("train.optimizer", "train.beta1", "train.beta2", "train.eps",
                     "train.global_batch_rows", "train.freeze")
RESUME_MUON_KEYS = ("train.muon_momentum",)  # compared when both sides train with muon
RESUME_SET_KEYS = frozenset({"train.freeze"})  # order and repeats carry no meaning


def _flat(data: Any, prefix: str) -> dict[str, Any]:
    """{"a.b[0].c": value}: descends into dicts and lists of dicts."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else key))
    elif isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        out[f"{prefix}#len"] = len(data)
        for i, value in enumerate(data):
            out.update(_flat(value, f"{prefix}[{i}]"))
    else:
        out[prefix] = data
    return out


def resume_mismatches(snapshot_config: Config, current: Config) -> list[tuple[str, Any, Any]]:
    """``(key, snapshot value, current value)`` for every resume-relevant key that differs."""
    old, new = to_dict(snapshot_config), to_dict(current)
    a = {**_flat(old["data"], "data"), **_flat(old["model"], "model")}
    b = {**_flat(new["data"], "data"), **_flat(new["model"], "model")}
    muon = old["train"]["optimizer"] == new["train"]["optimizer"] == "muon"
    for key in RESUME_TRAIN_KEYS + (RESUME_MUON_KEYS if muon else ()):
        section, name = key.split(".")
        a[key], b[key] = old[section][name], new[section][name]
        if key in RESUME_SET_KEYS:
            a[key], b[key] = sorted(set(a[key])), sorted(set(b[key]))
    out = []
    for key in sorted(set(a) | set(b)):
        if key in RESUME_MODEL_EXEMPT:
            continue
        va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
        if key == "model.vocab_size" and 0 in (va, vb):
            continue
        if va != vb:
            out.append((key.replace("#len", " (length)"), va, vb))
    return out


def check_resume_compatible(snapshot_config: Config, current: Config, *,
                            source: str | Path = "the snapshot") -> None:
    """Raise CheckpointError listing every mismatched key when an exact resume is unsafe."""
    diffs = resume_mismatches(snapshot_config, current)
    if not diffs:
        return
    listed = "; ".join(f"{k}: snapshot {va!r}, now {vb!r}" for k, va, vb in diffs)
    raise CheckpointError(f"cannot resume from {source}: config keys differ from the snapshot's "
                          f"({listed}); restore these values, or warm-start the weights only "
                          "(resets optimizer, spike guard, RNG and data cursor)")


def config_from_yaml(text: str, source: str) -> Config:
    """The :class:`Config` stored in a snapshot's ``config.yaml``."""
    OmegaConf = omegaconf().OmegaConf
    try:
        data = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    except Exception as exc:  # yaml and omegaconf errors have no common base
        raise CheckpointError(f"{source} is not valid YAML ({str(exc).splitlines()[0]}); the "
                              "snapshot is corrupted, rerun the segment that writes it") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{source} does not hold a config mapping; the snapshot is corrupted")
    try:
        return config_from_dict(data, source)
    except ConfigError as exc:
        raise CheckpointError(f"{source} is not a config this version reads ({exc}); resume "
                              "with the pipeline_lib version that wrote it") from None


def snapshot_config(path: Path, overrides: Sequence[str] = (), *,
                    fix: str = "rerun the training segment that writes it") -> Config:
    """The resolved config a snapshot was trained with (its ``config.yaml``), ``key=value``
    ``overrides`` on top. Complete already, so no default config is merged under it."""
    config_file = Path(path) / CONFIG_FILE
    if not Path(path).is_dir():
        raise CheckpointError(f"snapshot {path} does not exist or is not a directory; pass the "
                              "path of a snapshot directory (…/snapshots/step_NNNNNNN)")
    if not config_file.is_file():
        if not (Path(path) / MANIFEST_NAME).is_file():  # a data pack, a run directory, …
            raise CheckpointError(describe_non_snapshot(Path(path), "--snapshot"))
        raise CheckpointError(f"snapshot {path} has no {CONFIG_FILE}; it is incomplete: {fix}")
    return load_config(config_file, overrides, base=None)


def check_snapshot_fits_pack(snapshot: Path, data: Any, *, use: str, fix: str | None = None,
                             cfg: Config | None = None) -> None:
    """The pack ``data`` (a PackedData) holds the tokenizer ``snapshot`` was trained on
    (:func:`~pipeline_lib.data.tokenizer_identity.check_model_fits_pack`), the snapshot's
    ``tokenizer.json`` verified first: a damaged file is named as such, not as another
    tokenizer. ``cfg``: the snapshot's config when the caller has it."""
    verify_snapshot(snapshot, hash_files=[TOKENIZER_FILE])
    check_model_fits_pack(snapshot, cfg or snapshot_config(snapshot), data, use=use, fix=fix)
