"""H_eff sweep: validation loss at several test-time loop counts from ONE pass per batch.

Loop t never depends on the total loop count, so reading out after loops 1, 2, 4, 8 of a
single 8-loop pass gives exactly the losses of four separate evaluations (the prototype's
way) at about the cost of the deepest one. H_eff beyond the training loop count is allowed:
that is the extrapolation the research question asks about. The same run of the loops
also scores every adaptive-exit criterion (:mod:`.sweep_pass`).

Per-token losses are kept per document (:mod:`.heff_stats`), so every loss carries a
per-document bootstrap standard error and loss(h) − loss(1) a paired interval. On a labelled
pack the same pass also gives label accuracy per level at every H_eff and at every exit
(:mod:`.label_accuracy`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoint.compat import check_snapshot_fits_pack
from ..data.loader import PackedData
from ..device import resolve_device
from ..errors import ConfigError
from ..fsio import output_file_problem, write_text_atomic
from ..model.loop_sampling import deepest_loops
from ..precision import Precision
from ..spec.rules import check_test_loops
from .exit.criteria import check_model_criterion
from .exit.results import AdaptiveLosses, adaptive_section
from .exit.spec import ExitSpec
from .heff_stats import DocumentLosses, loss_statistics
from .label_accuracy import exit_label_section, label_section
from .loading import load_for_eval
from .sweep_pass import NoTokensScored, sweep_pass

log = logging.getLogger(__name__)


def parse_h_eff(text: str | Sequence[int], name: str = "--h-eff") -> list[int]:
    """``"1,2,4,8"`` (or a list) → sorted distinct loop counts, each ≥ 1; errors name
    ``name`` (the option, or the config key the list came from)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        values = sorted({int(str(v).strip()) for v in items if str(v).strip()})
    except ValueError:
        raise ConfigError(f"{name} {text!r} must be comma-separated integers, e.g. 1,2,4,8") \
            from None
    if not values or values[0] < 1:
        raise ConfigError(f"{name} {text!r} needs loop counts of at least 1, e.g. 1,2,4,8")
    check_test_loops(values[-1], name)
    return values


def sweep_documents(model: torch.nn.Module, batches: Any, h_effs: Sequence[int],
                    max_tokens: int, doc_levels: np.ndarray | None = None) -> DocumentLosses:
    """Summed token losses per document at every H_eff, up to ``max_tokens`` targets.

    Each batch runs its loops once and is read out after every listed count
    (:func:`~.sweep_pass.sweep_pass` without adaptive exit). ``doc_levels`` (level per
    global document, -1 = unknown) is used when batches carry ``doc_index``.
    """
    return sweep_pass(model, batches, h_effs, (), max_tokens, doc_levels).fixed


def _check_out(out: Path) -> None:
    problem = output_file_problem(out)
    if problem:
        raise ConfigError(f"cannot write the H_eff sweep to {out}: {problem}; pass --out a "
                          "JSON file path (e.g. eval/heff/step_NNNNNNN.json)")


def _check_pack(data: Any, data_dir: Path, snapshot: Path, cfg: Any,
                objective: str | None) -> str:
    """The objective whose tokens are scored (``objective``, else the snapshot's), once the
    pack fits the snapshot: its tokenizer, and answer spans for an ``answer_*`` one (a
    model trained on answer tokens only is scored on them only)."""
    check_snapshot_fits_pack(snapshot, data, use="H_eff sweep", cfg=cfg)
    objective = objective or cfg.train.objective
    if objective.startswith("answer_") and not data.has_answer_spans:
        raise ConfigError(_no_answers(objective, data_dir, "has no answer spans"))
    return objective


def _no_answers(objective: str, data_dir: Path, what: str) -> str:
    return (f"train.objective = {objective} scores answer tokens only, but the pack {data_dir} "
            f"{what}; sweep a pack with answer spans (a reasoning source, or prompt_field and "
            "answer_field on a jsonl/parquet source), or score every token with the override "
            "train.objective=deep_supervision")


def sweep_losses(model: torch.nn.Module, batches: Any, h_effs: Sequence[int],
                 max_tokens: int) -> tuple[dict[int, float], int]:
    """Token-weighted mean loss at every H_eff over ``batches``, up to ``max_tokens`` targets.

    Each batch runs once; the result equals the loss over all scored tokens at once (sums
    in float64), whatever the batching.
    """
    docs = sweep_documents(model, batches, h_effs, max_tokens)
    return docs.means(), docs.total_tokens


def sweep_result(step: int | None, losses: dict[int, float], tokens: int,
                 documents: DocumentLosses | None = None) -> dict[str, Any]:
    """The JSON document of one snapshot's sweep (see docs/evaluation.md); with
    ``documents``, also ``stderr``, ``documents``, ``paired`` and ``losses_by_level``."""
    hs = sorted(losses)
    ordered = [losses[h] for h in hs]
    stats = loss_statistics(documents) if documents is not None else {}
    return {
        "step": step,
        "losses": {str(h): losses[h] for h in hs},
        "perplexities": {str(h): math.exp(min(losses[h], 80.0)) for h in hs},
        "tokens": tokens,
        "deeper_better": all(b <= a for a, b in zip(ordered, ordered[1:], strict=False)),
        "best_h_eff": min(hs, key=lambda h: (losses[h], h)),
        **stats,
    }


def _adaptive_specs(adaptive: ExitSpec | Sequence[ExitSpec] | None,
                    h_effs: Sequence[int], model: Any) -> list[ExitSpec]:
    """The adaptive-exit specs resolved against ``h_effs``; checked before any work (the gate
    criterion needs a gated snapshot)."""
    specs = [adaptive] if isinstance(adaptive, ExitSpec) else list(adaptive or [])
    specs = [spec.resolved(h_effs) for spec in specs]
    for spec in specs:
        check_model_criterion(model, spec.criterion)
    return specs


def _adaptive_sections(results: Sequence[AdaptiveLosses], reference: DocumentLosses
                       ) -> dict[str, Any]:
    """``adaptive_by_criterion``: one section per criterion, in the configured order (with
    its label accuracy per threshold on a labelled pack)."""
    sections = {}
    for r in results:
        sections[r.spec.criterion] = adaptive_section(r, reference=reference)
        if r.labels is not None:
            sections[r.spec.criterion]["labels"] = exit_label_section(r.spec.thresholds,
                                                                      r.labels)
    return {"adaptive_by_criterion": sections}


def run_heff(snapshot: Path, data_dir: Path, h_effs: Sequence[int], out: Path, *,
             max_tokens: int, batch_rows: int, use_ema: bool = False,
             adaptive: ExitSpec | Sequence[ExitSpec] | None = None,
             device: str = "cpu", precision: str = "fp32",
             objective: str | None = None, spent: bool = True) -> dict[str, Any]:
    """Evaluate ``snapshot`` on the validation split of ``data_dir``; write ``out`` (JSON).

    ``objective`` (default: the snapshot's ``train.objective``) decides what is scored: an
    ``answer_*`` objective scores the answer tokens (and the EOS after each) alone, the
    tokens such a model was trained on; any other scores every token.

    ``adaptive``: also the adaptive exit (:mod:`.exit`) of each criterion, from the same
    run of the loops (:func:`_adaptive_sections`): the loops each token needs, and what a
    cached decoder spends under each ``kv_fill`` (:mod:`.exit.replay`; ``spent=False``
    leaves the latter out, for callers that want the one pass alone). The model and every
    batch live on ``device`` (``experiment.device``), passes run in ``precision``
    (``experiment.precision``).

    A labelled pack (``data.labelled``: targets are labels of the input tokens) adds the
    ``labels`` section (:func:`~.label_accuracy.label_section`), and ``labels`` to each
    adaptive section; an unlabelled pack's result is unchanged.
    """
    _check_out(out)  # before the sweep, not after it
    dev = resolve_device(device)
    amp = Precision.resolve(precision, dev)  # a device that cannot do it fails before loading
    data = PackedData(data_dir)
    loaded = load_for_eval(snapshot, use_ema=use_ema, with_tokenizer=False,  # scores token ids
                           device=dev, batch_rows=min(batch_rows, data.val_rows))
    objective = _check_pack(data, data_dir, snapshot, loaded.config, objective)
    answer_only = objective.startswith("answer_")
    specs = _adaptive_specs(adaptive, h_effs, loaded.model)
    with amp.autocast():
        try:  # one run of the loops per batch: every H_eff and every criterion
            # validation rows until max_tokens targets are scored (or the split ends)
            batches = data.eval_batches(data.val_rows, batch_rows, dev, answer_only=answer_only)
            swept = sweep_pass(loaded.model, batches, h_effs, specs, max_tokens, data.doc_levels,
                               spent=spent, labels=data.labelled)
        except NoTokensScored:
            if not answer_only:
                raise
            raise ConfigError(_no_answers(objective, data_dir, "has no answer tokens in its "
                                          "validation rows")) from None
    documents = swept.fixed
    losses, tokens = documents.means(), documents.total_tokens
    if tokens < max_tokens:
        log.info("validation split has only %d scorable tokens (eval.max_tokens = %d)",
                 tokens, max_tokens)
    result = sweep_result(loaded.step, losses, tokens, documents)
    result["scored_tokens"] = "answer" if answer_only else "all"
    result["device"], result["precision"] = dev.type, amp.name
    if specs:
        result.update(_adaptive_sections(swept.adaptive, documents))
    if swept.labels is not None:
        result["labels"] = label_section(swept.labels, data.train_levels, deepest_loops(
            loaded.config.train.loop_sampling, loaded.config.model.loops))
    log.info("H_eff sweep of %s: %s (deeper_better=%s)", snapshot,
             {h: round(v, 4) for h, v in losses.items()}, result["deeper_better"])
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(result, indent=2) + "\n")
    return result
