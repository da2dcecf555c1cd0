"""What the train, import and bench signatures hash: a change of these retrains (re-imports, rescores).

Keys the code learned after runs were made are left out while they hold their default, so
that a finished run does not retrain because the config grew an option; keys that never
change the weights are left out always. Torch-free: the Snakefile's plan uses it.
"""

from __future__ import annotations

from typing import Any

from .config import Config
from .config_write import config_hash, to_dict
from .init_source import fingerprint_id

# how long a segment job may run or wait, and on how few nodes it may go on after losing
# some: no effect on the weights of a segment that runs through (a stop resumes exactly)
JOB_KEYS = frozenset({"segment_runtime_minutes", "stop_margin_minutes", "rdzv_timeout_s",
                           "min_nnodes"})
# Model keys added after runs were made, at their defaults: left out of the train signature
# so that a finished run does not retrain because the code learned a new option.
LATER_MODEL_DEFAULTS = {"n_kv_heads": 0, "rope_scaling": "none", "rope_scaling_factor": 1.0,
                        "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
                        "rope_original_max_position": 8192, "exit_gate": False,
                        "head_dim": 0, "qkv_bias": False, "qk_norm": "none",
                        "norm_placement": "pre", "recurrence": "plain", "init": "scaled",
                        "learned_positions": 0}
LATER_BENCH_DEFAULTS = {"sampling": {"repeats": 1, "temperature": 0.0}}
LATER_TRAIN_DEFAULTS = {"muon_lr": 0.0, "muon_momentum": 0.95,
                        "muon_adjust_lr": "match_rms_adamw", "freeze": [],
                        "exit_entropy_weight": 0.01}
# train keys that never change the weights (recomputation is bit-identical; extra readouts
# of the validation loss only log more)
SAME_WEIGHTS_TRAIN_KEYS = frozenset({"activation_checkpointing", "val_h_eff"})


def without_later_defaults(section: dict[str, Any], later: dict[str, Any],
                            ignored: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``section`` without the ``ignored`` keys and the keys still at their ``later``
    default (keys added after runs were made must not retrain those runs)."""
    return {k: v for k, v in section.items()
            if k not in ignored and (k not in later or v != later[k])}


def as_written(section: dict[str, Any], tokenizer_ids: int) -> dict[str, Any]:
    """A model section (a dict) with ``vocab_size`` 0, as configs write it, where it is the
    tokenizer's ``tokenizer_ids`` that resolve_run fills in (``RunSpec.vocab_size``): runs made
    before keep their signatures (the size spelled out hashes like 0: the same weights)."""
    return {**section, "vocab_size": 0} if section["vocab_size"] == tokenizer_ids else section


def model_signature(model: Any, tokenizer_ids: int = 0) -> dict[str, Any]:
    """The model section as the train signature hashes it: keys at :data:`LATER_MODEL_DEFAULTS`
    and an empty ``init_from`` left out; an init source by its fingerprint; the vocabulary as
    written (:func:`as_written`)."""
    data = without_later_defaults(as_written(to_dict(model), tokenizer_ids),
                                  LATER_MODEL_DEFAULTS)
    init = data.pop("init_from", None) or {}
    if init.get("source"):
        data["init_from"] = {**init, "fingerprint": fingerprint_id(init["source"])}
    return data


def precision_signature(cfg: Config) -> dict[str, str]:
    """``experiment.precision`` unless auto (so the signatures of runs from before the key
    existed, all auto, stay what they were)."""
    precision = cfg.experiment.precision
    return {} if precision == "auto" else {"precision": precision}


def distill_signature(cfg: Config) -> dict[str, Any]:
    """``train.distill`` as the train signature hashes it: nothing while it is off (so the
    runs made before it existed keep their signature); a snapshot teacher with its
    fingerprint (a new teacher retrains; a ``source`` teacher's is the model's init_from)."""
    distill = to_dict(cfg.train.distill)
    if not distill["teacher"]:
        return {}
    if distill["teacher"] != "source":
        distill["fingerprint"] = fingerprint_id(distill["teacher"])
    return {"distill": distill}


def bench_signature(cfg: Config) -> str:
    """Hash of what determines a run's benchmark scores: the bench section (keys added later,
    at their defaults, left out: scores made before them are not redone) and the precision."""
    bench = without_later_defaults(to_dict(cfg.bench), LATER_BENCH_DEFAULTS)
    return config_hash({**bench, **precision_signature(cfg)})


def train_signature(cfg: Config, data_id: str, tokenizer_ids: int = 0) -> str:
    """Hash of what determines the trained weights: a change retrains, eval.* does not
    (``tokenizer_ids``: see :func:`as_written`)."""
    train = without_later_defaults(to_dict(cfg.train), LATER_TRAIN_DEFAULTS,
                                    JOB_KEYS | SAME_WEIGHTS_TRAIN_KEYS | {"distill"})
    train.update(distill_signature(cfg))
    relevant = {"seed": cfg.experiment.seed, "device": cfg.experiment.device,
                "data_id": data_id, "model": model_signature(cfg.model, tokenizer_ids),
                "train": train, "keep_best": cfg.snapshots.keep_best}
    return config_hash({**relevant, **precision_signature(cfg)})


def config_signature(cfg: Config, tokenizer_ids: int) -> str:
    """Hash of the whole resolved config (the vocabulary as written: :func:`as_written`)."""
    data = to_dict(cfg)
    return config_hash({**data, "model": as_written(data["model"], tokenizer_ids)})


def init_signature(cfg: Config) -> str:
    """What determines the imported snapshot: source fingerprint, model section, seed."""
    return config_hash({"source": fingerprint_id(cfg.model.init_from.source),
                        "model": model_signature(cfg.model), "seed": cfg.experiment.seed})
