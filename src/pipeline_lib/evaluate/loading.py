"""Load a snapshot for evaluation: verified weights (or their EMA), config, tokenizer.

Works on both kinds of snapshot without a process group: a sharded one (written by a
multi-process run, weights in ``model_dcp/``) is consolidated into full tensors by
:func:`~pipeline_lib.checkpoint.load_model_state`.

The tokenizer is the one the snapshot was trained with, found in this order:

1. ``tokenizer=PATH`` (a tokenizer.json or a data directory), when given;
2. a ``tokenizer.json`` stored inside the snapshot (an extra file);
3. the data pack the snapshot's config points at:
   ``{results_dir}/data/{data_id}/tokenizer.json``, with ``results_dir`` taken as written
   (relative to the working directory) and, failing that, as the directory three levels
   above the snapshot (``results/{run}/snapshots/step_…``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, DataError

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"


@dataclass
class LoadedModel:
    """A snapshot ready for evaluation: model (eval mode), config, tokenizer."""

    path: Path
    step: int | None
    config: Any  # pipeline_lib.config.Config, as resolved for the run
    model: torch.nn.Module  # LoopedLM in eval mode, on the CPU
    tokenizer: Any  # tokenizers.Tokenizer (None when not asked for)
    seq_len: int


def _snapshot_config(path: Path) -> Any:
    from ..config import load_config

    config_file = path / "config.yaml"
    if not config_file.is_file():
        raise CheckpointError(f"snapshot {path} has no config.yaml; it is incomplete, rerun the "
                              "training segment that writes it")
    return load_config(config_file, base=None)


def _tokenizer_candidates(path: Path, cfg: Any) -> list[Path]:
    from ..data.identity import data_id

    ident = data_id(cfg.data)
    results = Path(cfg.experiment.results_dir)
    candidates = [path / TOKENIZER_FILE, results / "data" / ident / TOKENIZER_FILE]
    resolved = path.resolve()
    if len(resolved.parents) >= 3:
        candidates.append(resolved.parents[2] / "data" / ident / TOKENIZER_FILE)
    return candidates


def find_tokenizer(path: Path, cfg: Any, override: Any = None) -> Any:
    """The snapshot's tokenizer (see the module docstring for the search order)."""
    from ..data.tokenizer import load_tokenizer

    if override not in (None, ""):
        return load_tokenizer(Path(str(override)))
    candidates = _tokenizer_candidates(path, cfg)
    for candidate in candidates:
        if candidate.is_file():
            log.info("tokenizer of %s: %s", path, candidate)
            return load_tokenizer(candidate)
    raise DataError(f"no tokenizer found for snapshot {path} (looked at "
                    f"{', '.join(str(c) for c in candidates)}); pass tokenizer=PATH/tokenizer.json "
                    "in --model_args")


def load_for_eval(path: Path, *, use_ema: bool = False, tokenizer: Any = None,
                   with_tokenizer: bool = True) -> LoadedModel:
    """Verified weights + config (+ tokenizer) of the snapshot at ``path``, as a ready model.

    ``with_tokenizer=False`` skips the tokenizer search (loss-only evaluation needs none).
    """
    from ..checkpoint.manifest import verify_snapshot
    from ..checkpoint.snapshot import load_model_state
    from ..model import LoopedLM

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"snapshot {path} does not exist or is not a directory; pass "
                              "snapshot=DIR of a finished training segment")
    verify_snapshot(path, hash_files=["config.yaml", "trainer_state.json"])
    cfg = _snapshot_config(path)
    if cfg.model.vocab_size < 1:
        raise CheckpointError(f"snapshot {path}/config.yaml has model.vocab_size = "
                              f"{cfg.model.vocab_size}; it must hold the resolved config")
    state = load_model_state(path, which="ema" if use_ema else "model")
    model = LoopedLM(cfg.model)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"snapshot {path} weights do not fit its config.yaml (missing "
                              f"{sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}); "
                              "the snapshot is from another model version")
    model.eval()
    trainer_state = json.loads((path / "trainer_state.json").read_text())
    step = trainer_state.get("step")
    tok = find_tokenizer(path, cfg, tokenizer) if with_tokenizer else None
    if tok is not None and tok.get_vocab_size() > cfg.model.vocab_size:
        raise CheckpointError(f"tokenizer of snapshot {path} has {tok.get_vocab_size()} tokens "
                              f"but the model only {cfg.model.vocab_size}; pass the tokenizer "
                              "the snapshot was trained with (tokenizer=PATH)")
    return LoadedModel(path=path, step=int(step) if step is not None else None, config=cfg,
                       model=model, tokenizer=tok, seq_len=cfg.data.seq_len)
