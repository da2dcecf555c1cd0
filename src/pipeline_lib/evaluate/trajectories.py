"""Latent trajectories: how sampled validation tokens' loop states move, loop by loop, up to
and past the training loop count (the ``trajectories`` command, rule ``eval_trajectories``).

A seeded sample of validation tokens (:func:`sampled_batches`: rows in a seeded order, up to
:data:`TOKENS_PER_ROW` scored positions from each, so the sample spreads over many
documents) is run through the loops ONCE per batch up to M (default 2 × ``model.loops``:
extrapolation); each sampled token's state after every loop and its readout's KL to the
readout after loop M are kept (:func:`record_batch`). :mod:`.trajectory_paths` turns the
paths into per-loop measures, a class per token (converging, orbiting, drifting) and a 2-D
PCA; :mod:`.trajectory_plot` draws them. The paths need only the input tokens (and their
positions and documents); the targets only say which positions may be sampled: those with a
next token, or on a labelled pack (targets = labels of the input tokens) the labelled ones. Output: ``trajectories.json`` and
``trajectories.png`` in one directory, published together (:mod:`pipeline_lib.output_set`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..checkpoint.compat import check_snapshot_fits_pack
from ..data.loader import PackedData
from ..device import resolve_device
from ..errors import ConfigError, DataError
from ..output_paths import check_output_dir
from ..output_set import output_set
from ..precision import Precision
from ..spec.layout import TRAJECTORIES_FIGURE, TRAJECTORIES_JSON
from ..spec.names import IGNORE_INDEX
from ..spec.rules import check_test_loops
from .exit.criteria import exit_scores
from .exit.readout import LoopHidden
from .loading import load_for_eval
from .trajectory_paths import (
    MEASURES,
    class_counts,
    classify_paths,
    path_measures,
    pca_2d,
    per_loop_summary,
    rules,
    tail_steps,
)
from .trajectory_plot import plot_trajectories

log = logging.getLogger(__name__)

DEFAULT_TOKENS = 256  # enough for stable per-loop quantiles, a figure that stays legible
SAMPLE_SEED = 0  # the sample is part of the result: the same snapshot gives the same tokens
TOKENS_PER_ROW = 4  # at most this many sampled positions per validation row


@dataclass
class Recorded:
    """The sampled tokens' paths: states [n, M+1, D] (s_0..s_M), KL to the final readout
    [n, M], and where each token is (validation row, position, input token id)."""

    states: Tensor
    kl: Tensor
    rows: list[int]
    positions: list[int]
    token_ids: list[int]


def is_trajectories_dir(path: Path) -> bool:
    """Whether ``path`` holds a result of :func:`run_trajectories` (its JSON)."""
    return (Path(path) / TRAJECTORIES_JSON).is_file()


def check_trajectory_args(tokens: int, max_loops: int | None) -> None:
    """``--tokens`` and ``--max-loops`` before anything is loaded (one line each)."""
    if tokens < 1:
        raise ConfigError(f"--tokens {tokens}: sample at least 1 validation token (default "
                          f"{DEFAULT_TOKENS})")
    if max_loops is not None and max_loops < 1:
        raise ConfigError(f"--max-loops {max_loops}: run at least 1 loop (default 2 × "
                          "model.loops, past the training loop count)")
    if max_loops is not None:
        check_test_loops(max_loops, "--max-loops")


def sampled_batches(data: Any, tokens: int, batch_rows: int, seed: int = SAMPLE_SEED
                    ) -> Iterator[tuple[dict[str, Tensor], np.ndarray, np.ndarray]]:
    """(CPU batch, its validation rows, sampled flat positions row·L + column) until
    ``tokens`` positions are sampled or the split ends; only positions with a target (a
    next token, or a label) are picked. Picks depend on the seed and the rows alone, not on
    ``batch_rows``."""
    if data.val_rows == 0:
        raise DataError(f"{data.data_dir} has no validation rows; set data.val_fraction > 0 "
                        "and re-pack")
    rng = np.random.default_rng(seed)
    order = rng.permutation(data.val_rows)
    taken = 0
    for start in range(0, len(order), batch_rows):
        rows = order[start:start + batch_rows]
        batch = data.val_batch(rows)
        targets = batch["targets"].numpy()
        flat: list[int] = []
        for r in range(len(rows)):
            scored = np.flatnonzero(targets[r] != IGNORE_INDEX)
            picks = np.sort(rng.choice(scored, min(TOKENS_PER_ROW, len(scored)), replace=False))
            flat += [r * targets.shape[1] + int(p) for p in picks[:tokens - taken - len(flat)]]
        if flat:
            yield batch, rows, np.asarray(flat, dtype=np.int64)
        taken += len(flat)
        if taken >= tokens:
            return


@torch.no_grad()
def record_batch(model: torch.nn.Module, batch: dict[str, Tensor], rows: Tensor,
                 max_loops: int) -> tuple[Tensor, Tensor]:
    """(states [k, M+1, D] fp32, KL(p_t ‖ p_M) [k, M] fp64) of the flat positions ``rows``
    [k]: the loops run once, up to ``max_loops``; each loop's state and readout hidden rows
    are kept, the readouts compared with the last one at the end."""
    ctx = model.embed(batch)
    state = model.init_state(ctx)
    states = [LoopHidden(model, state, ctx).state_rows(rows).float()]
    hidden = []
    for t in range(1, max_loops + 1):
        state = model.forward_loops(ctx, t - 1, t, state)
        loop = LoopHidden(model, state, ctx)
        states.append(loop.state_rows(rows).float())
        hidden.append(loop.rows(rows))

    def logp(h: Tensor) -> Tensor:
        return torch.log_softmax(F.linear(h, model.head_weight).float(), dim=-1)

    final = logp(hidden[-1])
    kl = torch.stack([exit_scores(logp(h), final, "kl") for h in hidden], dim=1)
    return torch.stack(states, dim=1), kl.double()


def record(model: torch.nn.Module, data: Any, tokens: int, max_loops: int, batch_rows: int,
           device: torch.device, seed: int = SAMPLE_SEED) -> Recorded:
    """The paths of ``tokens`` sampled validation tokens (fewer when the split has fewer)."""
    model.eval()
    parts: list[tuple[Tensor, Tensor]] = []
    where: list[tuple[int, int, int]] = []
    for batch, rows, flat in sampled_batches(data, tokens, batch_rows, seed):
        length = batch["input_ids"].shape[1]
        ids = batch["input_ids"].reshape(-1)
        where += [(int(rows[f // length]), int(f % length), int(ids[f])) for f in flat]
        on_device = {k: v.to(device) for k, v in batch.items()}
        states, kl = record_batch(model, on_device, torch.as_tensor(flat, device=device),
                                  max_loops)
        parts.append((states.cpu(), kl.cpu()))
    if not where:
        raise DataError(f"{data.data_dir}: the validation rows hold no scored token; raise "
                        "data.val_fraction and re-pack")
    if len(where) < tokens:
        log.info("the validation split gave %d tokens (--tokens %d)", len(where), tokens)
    return Recorded(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
                    *map(list, zip(*where, strict=True)))


def trajectory_result(recorded: Recorded, training_loops: int) -> dict[str, Any]:
    """The JSON document (see docs/evaluation.md) of the recorded paths."""
    states = recorded.states
    max_loops = states.shape[1] - 1
    measures = {**path_measures(states), "kl_to_final": recorded.kl}
    classes = classify_paths(states)
    projected, explained = pca_2d(states)
    paths = [{"row": row, "position": pos, "token_id": tok, "class": cls,
              **{name: measures[name][i].tolist() for name in MEASURES},
              "pca": projected[i].tolist()}
             for i, (row, pos, tok, cls) in enumerate(zip(
                 recorded.rows, recorded.positions, recorded.token_ids, classes, strict=True))]
    return {"training_loops": training_loops, "max_loops": max_loops,
            "loops": list(range(1, max_loops + 1)), "tokens": len(classes),
            "measures": {name: per_loop_summary(measures[name]) for name in MEASURES},
            "classes": class_counts(classes),
            "rules": {**rules(), "tail_steps": tail_steps(max_loops)},
            "pca": {"explained_variance_ratio": explained}, "paths": paths}


def run_trajectories(snapshot: Path, data_dir: Path, out_dir: Path, *,
                     tokens: int = DEFAULT_TOKENS, max_loops: int | None = None,
                     batch_rows: int = 8, use_ema: bool = False, device: str = "cpu",
                     precision: str = "fp32", seed: int = SAMPLE_SEED) -> dict[str, Any]:
    """Record the trajectories of ``tokens`` sampled validation tokens of ``data_dir`` under
    ``snapshot`` for loops 1..``max_loops`` (default 2 × ``model.loops``); write
    ``trajectories.json`` and ``trajectories.png`` into ``out_dir`` together. The model runs
    on ``device`` in ``precision``; the measures are computed in fp32/fp64."""
    check_trajectory_args(tokens, max_loops)
    check_output_dir(Path(out_dir), "--out", owned=is_trajectories_dir,
                     kind=f"a trajectories result (no {TRAJECTORIES_JSON})")
    dev = resolve_device(device)
    amp = Precision.resolve(precision, dev)
    loaded = load_for_eval(snapshot, use_ema=use_ema, with_tokenizer=False, device=dev)
    data = PackedData(data_dir)
    check_snapshot_fits_pack(snapshot, data, use="latent trajectories", cfg=loaded.config)
    training_loops = loaded.config.model.loops
    loops = 2 * training_loops if max_loops is None else max_loops
    check_test_loops(loops, "--max-loops")
    with amp.autocast():
        recorded = record(loaded.model, data, tokens, loops, batch_rows, dev, seed)
    result = {"step": loaded.step, "seed": seed, "device": dev.type, "precision": amp.name,
              **trajectory_result(recorded, training_loops)}
    with output_set() as outputs:
        staged = outputs.folder(Path(out_dir))
        (staged / TRAJECTORIES_JSON).write_text(json.dumps(result) + "\n")
        plot_trajectories(result, staged / TRAJECTORIES_FIGURE)
    log.info("trajectories of %s: %d tokens over %d loops, %s", snapshot, result["tokens"],
             loops, result["classes"])
    return result
