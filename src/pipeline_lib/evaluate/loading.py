"""Load a snapshot for evaluation: verified weights (or their EMA), config, tokenizer.

Works on both kinds of snapshot without a process group: a sharded one (written by a
multi-process run, weights in ``model_dcp/``) is consolidated into full tensors by
:func:`~pipeline_lib.checkpoint.restore.load_model_state`.

The tokenizer is the snapshot's own ``tokenizer.json`` (the trainer writes it into every
snapshot, covered by MANIFEST.json), so the snapshot directory is all evaluation needs; an
explicit ``tokenizer=PATH`` (lm-eval ``--model_args``) overrides it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.compat import snapshot_config
from ..checkpoint.contents import CONFIG_FILE, TRAINER_STATE
from ..checkpoint.manifest import MANIFEST_NAME, describe_non_snapshot, verify_snapshot
from ..checkpoint.restore import load_model_state
from ..checkpoint.tensorio import read_json
from ..data.tokenizer_identity import check_same_tokenizer, identify, snapshot_identity
from ..errors import CheckpointError
from ..memory_check import check_memory
from ..model.looped import LoopedLM
from ..spec.data_id import data_id
from ..spec.layout import ResultsLayout
from ..spec.memory import inference_memory, model_subject
from ..spec.names import TOKENIZER_FILE


@dataclass
class LoadedModel:
    """A snapshot ready for evaluation: model (eval mode), config, tokenizer."""

    path: Path
    step: int | None
    config: Any  # pipeline_lib.spec.config.Config, as resolved for the run
    model: torch.nn.Module  # LoopedLM in eval mode, on the device asked for
    tokenizer: Any  # tokenizers.Tokenizer (None when not asked for)
    seq_len: int


def snapshot_tokenizer(path: Path, cfg: Any, override: Any = None,
                       option: str = "tokenizer={} in --model_args") -> Any:
    """The tokenizer stored in the snapshot at ``path`` (or ``override``, a tokenizer.json);
    ``option`` is how the caller's user passes one (``{}``: the data pack's tokenizer.json)."""
    from ..data.tokenizer import load_tokenizer  # lazy: tokenizers, unused by loss-only evals

    stored = path / TOKENIZER_FILE
    if override not in (None, ""):
        return _override_tokenizer(path, cfg, Path(str(override)), option)
    if not stored.is_file():
        pack = ResultsLayout(cfg.experiment.results_dir).data_dir(data_id(cfg.data))
        raise CheckpointError(f"snapshot {path} has no {TOKENIZER_FILE} (written before "
                              "snapshots carried their tokenizer); retrain its segment, or pass "
                              f"{option.format(pack / TOKENIZER_FILE)} (its data pack's)")
    return load_tokenizer(stored)


def _override_tokenizer(path: Path, cfg: Any, override: Path, option: str) -> Any:
    """The tokenizer passed instead of the snapshot's own: it must exist and be the one the
    snapshot was trained on (by identity; by size for a snapshot without tokenizer.json)."""
    from ..data.tokenizer import load_tokenizer  # lazy: as in snapshot_tokenizer

    given = option.format(override)
    if not override.is_file():
        what = "is a directory" if override.is_dir() else "does not exist"
        raise CheckpointError(f"{given}: {override} {what}; pass a tokenizer.json file, or "
                              f"leave it out to use the snapshot's own {TOKENIZER_FILE}")
    tok = load_tokenizer(override)
    check_same_tokenizer(snapshot_identity(path, cfg), identify(override, None,
                                                               tok.get_vocab_size()),
                         use=given, model_name=f"snapshot {path}", data_name=str(override),
                         fix=f"leave it out (the snapshot's own {TOKENIZER_FILE} is the one it "
                             "was trained on) or pass that tokenizer")
    return tok


def untrained_gate(path: Path, cfg: Any, step: Any) -> str | None:
    """Why the exit gate of the snapshot at ``path`` was never trained, or None (no gate, or
    a trained one). What the snapshot records decides: only ``train.objective =
    expected_exit`` trains the gate, and only in steps actually taken (an imported snapshot
    is at step 0)."""
    if not cfg.model.exit_gate:
        return None
    if cfg.train.objective != "expected_exit":
        return (f"snapshot {path} was trained with train.objective = {cfg.train.objective}, "
                "which never trains the gate")
    if not step:
        return f"snapshot {path} has taken no training step (its gate is as initialised)"
    return None


def snapshot_record(path: Path, hash_files: Sequence[str] = ()) -> tuple[int | None, Any]:
    """(step, resolved config) of the snapshot at ``path``, its config.yaml,
    trainer_state.json and ``hash_files`` verified against the manifest; its weights are
    neither read nor hashed (a bench with no tasks reports these alone)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"snapshot {path} does not exist or is not a directory; pass "
                              "snapshot=DIR of a finished training segment")
    if not (path / MANIFEST_NAME).is_file():  # an export, a pack, a run directory, …
        raise CheckpointError(describe_non_snapshot(path, "--snapshot"))
    verify_snapshot(path, hash_files=[CONFIG_FILE, TRAINER_STATE, *hash_files])
    cfg = snapshot_config(path)
    if cfg.model.vocab_size < 1:
        raise CheckpointError(f"snapshot {path}/config.yaml has model.vocab_size = "
                              f"{cfg.model.vocab_size}; it must hold the resolved config")
    step = read_json(path / TRAINER_STATE).get("step")
    return (int(step) if step is not None else None), cfg


def load_for_eval(path: Path, *, use_ema: bool = False, tokenizer: Any = None,
                  with_tokenizer: bool = True,
                  tokenizer_option: str = "tokenizer={} in --model_args",
                  device: torch.device | str = "cpu", batch_rows: int = 0) -> LoadedModel:
    """Verified weights + config (+ tokenizer) of the snapshot at ``path``, as a ready model
    built on ``device`` (weights fp32, as stored).

    ``with_tokenizer=False`` skips the tokenizer (loss-only evaluation needs none);
    ``tokenizer_option`` names the caller's way to pass one (see :func:`snapshot_tokenizer`).
    Before a weight is read, a model (and, with ``batch_rows``, the caller's batches of
    ``eval.batch_rows`` full rows) too big for ``device`` is refused in one line
    (:func:`~pipeline_lib.memory_check.check_memory`).
    """
    path = Path(path)
    step, cfg = snapshot_record(path, [TOKENIZER_FILE] if with_tokenizer else [])
    check_memory(inference_memory(cfg.model, rows=batch_rows, seq_len=cfg.data.seq_len,
                                  rows_key="eval.batch_rows",
                                  subject=f"snapshot {path} with {model_subject(cfg.model)}"),
                 torch.device(device), "evaluating it")
    state = load_model_state(path, which="ema" if use_ema else "model")
    with torch.device(device):  # built where it runs: no CPU copy of every weight first
        model = LoopedLM(cfg.model)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"snapshot {path} weights do not fit its config.yaml (missing "
                              f"{sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}); "
                              "the snapshot is from another model version")
    model.eval()
    model.untrained_exit_gate = untrained_gate(path, cfg, step)  # read by the gate criterion
    tok = snapshot_tokenizer(path, cfg, tokenizer, tokenizer_option) if with_tokenizer else None
    if tok is not None and tok.get_vocab_size() > cfg.model.vocab_size:
        raise CheckpointError(f"tokenizer of snapshot {path} has {tok.get_vocab_size()} tokens "
                              f"but the model only {cfg.model.vocab_size}; pass the tokenizer "
                              "the snapshot was trained with (tokenizer=PATH)")
    return LoadedModel(path=path, step=step, config=cfg, model=model, tokenizer=tok,
                       seq_len=cfg.data.seq_len)
