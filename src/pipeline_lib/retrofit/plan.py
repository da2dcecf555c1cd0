"""``retrofit-plan``: score prelude / core / coda choices of a pretrained model on held-out
rows before any training, and say which one to start from.

The source is read once (every layer) and run whole on the validation rows of a pack: the
original's per-document losses and its layer-to-layer measures (:mod:`.layer_similarity`).
Every candidate of :mod:`~pipeline_lib.pretrained.retrofit_candidates` gets its pre-score
from those; the best ``measure`` of them by pre-score, and the config's own
``model.init_from`` choice when it has one, are built from the same tensors (no second read
of the source) with the config's recurrence, injection and state init, and scored at step 0
at every H_eff: loss, the paired difference to the original on the same documents (95%
interval, documents resampled), the loop drift ``‖s_L − s_{L−1}‖ / ‖s_L‖`` and the state's
RMS over the RMS the coda was trained on, at the training loop count L. They are ranked by
loss at L. FLOPs per token are :func:`pipeline_lib.spec.size.flops_per_token`'s.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.loader import PackedData
from ..errors import ConfigError
from ..evaluate.heff import sweep_documents
from ..evaluate.heff_stats import DocumentLosses
from ..evaluate.stats import document_bootstrap, paired_column_diffs
from ..output_set import output_set
from ..pretrained.hf_layout import LayerChoice, init_choice
from ..pretrained.init import init_model_config, original_config
from ..pretrained.pretrained_source import PretrainedSource, read_source
from ..pretrained.retrofit_candidates import Candidate, check_budget, enumerate_candidates
from ..spec.config import Config
from ..spec.size import flops_per_token
from .hf_import import build_imported_model, mapped_state
from .layer_similarity import LayerSimilarity, measure
from .report import plan_figure, plan_markdown

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """What one plan measures on: the source, the held-out rows, the settings."""

    source: PretrainedSource
    data: PackedData
    cfg: Config  # recurrence, injection, state init, seed of the candidates
    loops: int
    h_effs: list[int]
    rows: int
    budget: int
    own: LayerChoice | None = None  # the config's model.init_from choice, checked

    def batches(self) -> Iterator[dict[str, torch.Tensor]]:
        return self.data.val_batches(self.rows, self.cfg.eval.batch_rows)

    @property
    def max_tokens(self) -> int:
        """Every target of the chosen rows."""
        return self.rows * self.data.seq_len


def remapped_state(whole: dict[str, Any], choice: LayerChoice) -> dict[str, Any]:
    """The tensors of ``choice`` taken from a whole import's (``core.i.*`` = source layer i)."""
    out = {k: v for k, v in whole.items() if not k.startswith("core.")}
    for part in ("prelude", "core", "coda"):
        for j, layer in enumerate(choice.layers(part)):
            prefix = f"core.{layer}."
            out.update({f"{part}.{j}.{k[len(prefix):]}": v for k, v in whole.items()
                        if k.startswith(prefix)})
    return out


def _candidate_config(inp: PlanInputs, choice: LayerChoice) -> Config:
    cfg = dataclasses.replace(inp.cfg, model=dataclasses.replace(inp.cfg.model, loops=inp.loops))
    return init_model_config(cfg, inp.source, choice, inp.cfg.model.init_from.adapter)


@torch.no_grad()
def loop_drift(model: torch.nn.Module, batch: dict[str, torch.Tensor], loops: int,
               coda_rms: float) -> dict[str, float]:
    """At the last of ``loops`` loops: ‖s_L − s_{L−1}‖ / ‖s_L‖ and RMS(s_L) / ``coda_rms``."""
    ctx = model.embed(batch)
    before = model.forward_loops(ctx, 0, loops - 1)
    last = model.forward_loops(ctx, loops - 1, loops, before)
    drift = float((last - before).float().norm() / last.float().norm().clamp_min(1e-30))
    rms = float(last.float().pow(2).mean().sqrt())
    return {"drift": drift, "rms_ratio": rms / coda_rms if coda_rms else float("nan")}


def paired_to_original(original: DocumentLosses, cand: DocumentLosses) -> dict[str, Any]:
    """Loss at each H_eff and its difference to the original on the same documents."""
    if not np.array_equal(original.tokens, cand.tokens):
        raise RuntimeError("candidate and original scored different tokens")
    sums = np.hstack([original.loss_sums, cand.loss_sums])
    point = sums.sum(axis=0) / original.total_tokens
    diffs = paired_column_diffs(document_bootstrap(sums, original.tokens), point, 0)
    return {"losses": {str(h): float(point[j + 1]) for j, h in enumerate(cand.h_effs)},
            "vs_original": {str(h): diffs[j + 1].to_json() for j, h in enumerate(cand.h_effs)}}


def score_candidate(inp: PlanInputs, whole: dict[str, Any], cand: Candidate,
                    original: DocumentLosses, coda_rms: float) -> dict[str, Any]:
    """One candidate built and scored at step 0 (see the module)."""
    cfg = _candidate_config(inp, cand.choice)
    model = build_imported_model(cfg, remapped_state(whole, cand.choice)).eval()
    docs = sweep_documents(model, inp.batches(), inp.h_effs, inp.max_tokens)
    first = next(iter(inp.batches()))
    return {"label": cand.label(inp.loops), "init_from": cand.choice.as_lists(),
            "pre_score": round(cand.proxy, 6), "dropped_layers": cand.dropped,
            "block_applications": cand.applications(inp.loops),
            "flops_per_token": flops_per_token(cfg.model, inp.data.seq_len),
            **paired_to_original(original, docs),
            **loop_drift(model, first, inp.loops, coda_rms)}


def _to_measure(inp: PlanInputs, ranked: list[Candidate], n: int) -> list[Candidate]:
    """The ``n`` best by pre-score and the config's own choice (when it gives one)."""
    chosen = ranked[:n]
    if inp.own is not None:
        match = [c for c in ranked if c.choice == inp.own]
        extra = match[0] if match else Candidate(inp.own, float("nan"))
        if extra not in chosen:
            chosen.append(extra)
    return chosen


def plan(inp: PlanInputs, measure_n: int) -> dict[str, Any]:
    """The whole plan as a JSON-able dict (``candidates`` ranked by loss at L)."""
    torch.manual_seed(inp.cfg.experiment.seed)
    whole = mapped_state(inp.source, LayerChoice.whole(inp.source.arch.layers))
    original_cfg = original_config(inp.cfg, inp.source)
    model = build_imported_model(original_cfg, whole).eval()
    original = sweep_documents(model, inp.batches(), [1], inp.max_tokens)
    if original.total_tokens == 0:
        raise ConfigError(f"{inp.data.data_dir}: no validation tokens to score; pack with "
                          "data.val_fraction > 0")
    sim: LayerSimilarity = measure(model, inp.batches())
    del model
    ranked = enumerate_candidates(sim.angular, inp.loops, inp.budget)
    chosen = _to_measure(inp, ranked, measure_n)
    scored = []
    for i, cand in enumerate(chosen, 1):
        log.info("retrofit-plan: candidate %d/%d %s", i, len(chosen), cand.label(inp.loops))
        coda_rms = float(sim.rms[cand.choice.coda[0]])
        scored.append(score_candidate(inp, whole, cand, original, coda_rms))
    at = str(inp.loops) if inp.loops in inp.h_effs else str(inp.h_effs[-1])
    scored.sort(key=lambda r: r["losses"][at])
    return {"source": str(inp.source.path), "layers": inp.source.arch.layers,
            "loops": inp.loops, "budget_blocks": inp.budget, "h_eff": inp.h_effs,
            "ranked_at_h_eff": int(at), "rows": inp.rows, "tokens": original.total_tokens,
            "documents": int(len(original.tokens)),
            "original": {"loss": original.means()[1],
                         "flops_per_token": flops_per_token(original_cfg.model,
                                                            inp.data.seq_len)},
            "candidates_considered": len(ranked), "candidates": scored,
            "layers_measured": sim.to_json()}


def plan_inputs(cfg: Config, source: str | Path, data_dir: Path, *, loops: int,
                h_effs: list[int], rows: int, budget: int | None) -> PlanInputs:
    """The checked inputs: the source read and checked, the pack's tokenizer the source's,
    the config's own layer choice checked as import-hf checks it (one line, before any
    work: a choice the import refuses is never measured nor recommended)."""
    src = read_source(source)
    init = cfg.model.init_from
    own = init_choice(init, src.arch.layers) if init.prelude or init.core or init.coda else None
    data = PackedData(data_dir)
    if data.vocab_size > src.arch.vocab_size:
        raise ConfigError(f"{data_dir}: packed with a {data.vocab_size}-token vocabulary, but "
                          f"{source} has {src.arch.vocab_size} embedding rows; pack with the "
                          f"source's own tokenizer (data.tokenizer: {{type: file, path: "
                          f"{source}}})")
    if rows < 1:
        raise ConfigError(f"--rows {rows} must be at least 1")
    budget = src.arch.layers if budget is None else budget
    check_budget(src.arch.layers, loops, budget)
    return PlanInputs(src, data, cfg, loops, h_effs, rows, budget, own)


def write_plan(result: dict[str, Any], out: Path) -> None:
    """``plan.json``, ``plan.md`` and ``plan.png`` in ``out``, published together."""
    with output_set() as outputs:
        folder = outputs.folder(out)
        (folder / "plan.json").write_text(json.dumps(result, indent=2) + "\n")
        (folder / "plan.md").write_text(plan_markdown(result))
        plan_figure(result, folder / "plan.png")
