"""One command that checks the accelerator paths on the configured device:
``python -m pipeline_lib device-check [--config F] [key=value …]`` (``benchmarks/device_check.py``
runs the same). Run it once on a new GPU/NPU node before a real run.

Every check runs on ``experiment.device`` (in ``experiment.precision`` where this build has
that key) on tiny inputs it makes itself, and reports pass, fail or skip with figures:

- ``train_steps``: 4 optimizer steps of a tiny looped MoE model through the real segment job
  (:func:`~pipeline_lib.train.job.train_segment`): finite losses, tokens/s of the step loop.
- ``snapshot_resume``: the same 4 steps as 2 + 2 segments (snapshot written, verified,
  resumed) against the uninterrupted run: losses and weights bit-identical
  (``train.deterministic``); the largest weight difference otherwise.
- ``flex_attention``: compiled FlexAttention against SDPA at four row lengths: the largest
  difference, graphs compiled after the first length (must be 0), ms per call of each
  kernel; gradients too off the CPU (torch has no CPU backward for FlexAttention).
- ``moe_grouped_mm``: grouped GEMM against the per-expert loop, forward and backward, on an
  aligned expert shape (difference, ms each), and an unaligned width (58) that must fall
  back to the loop.
- ``generation``: greedy samples through the trainer's sampling path (a KV cache, where the
  build has one) against a reference that recomputes the whole prefix per token: identical
  tokens, tokens/s of each.

Timings are single wall-clock measurements on whatever else the machine runs: indicative.
A check that raises is reported as failed with its error line, and the others still run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import Config, DataConfig, ModelConfig, SourceConfig, load_config
from ..device import resolve_device, synchronize

log = logging.getLogger(__name__)

CHECKS = ("train_steps", "snapshot_resume", "flex_attention", "moe_grouped_mm", "generation")
TINY = ["model.d_model=64", "model.n_heads=4", "model.loops=2", "model.prelude_layers=1",
        "model.core_layers=1", "model.coda_layers=0", "model.moe_experts=4", "model.moe_top_k=2",
        "model.loss_chunk_size=256", "train.total_steps=4", "train.steps_per_segment=4",
        "train.global_batch_rows=8", "train.micro_batch_rows=4", "train.warmup_steps=1",
        "train.eval_interval=0", "train.eval_rows=4", "train.diagnostics_interval=0",
        "train.sample_tokens=8", "train.objective=deep_supervision", "train.spike.warmup_steps=4",
        "train.deterministic=true", "train.nproc=1", "train.nnodes=1", "tracking.enabled=false"]
DATA = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=300, max_difficulty=3, seed=1)],
                  seq_len=128, epochs=1, val_fraction=0.1, seed=3)
STEPS = 4
LENGTHS = (100, 300, 517, 1000)  # rows FlexAttention sees padded to 256, 384, 640, 1024


@dataclass
class CheckResult:
    """One row of the report."""

    name: str
    status: str  # pass | fail | skip
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""


@dataclass
class _Context:
    cfg: Config
    device: torch.device
    work: Path
    _pack: Path | None = None

    def pack(self) -> Path:
        if self._pack is None:
            from ..data.pack import pack_corpus

            self._pack = self.work / "data"
            pack_corpus(self.cfg.data, self._pack)
        return self._pack

    @property
    def precision(self) -> str:
        return str(getattr(self.cfg.experiment, "precision", "fp32"))

    def autocast(self) -> contextlib.AbstractContextManager:
        """The compute precision's autocast (where this build resolves precision)."""
        try:
            from ..precision import Precision  # type: ignore[import-not-found]
        except ImportError:
            return contextlib.nullcontext()
        return Precision.resolve(self.precision, self.device).autocast()

    def dtype(self) -> torch.dtype:
        with self.autocast():
            return torch.get_autocast_dtype(self.device.type) if torch.is_autocast_enabled(
                self.device.type) else torch.float32

    def tolerance(self) -> float:
        return 1e-4 if self.dtype() == torch.float32 else 3e-2


def check_config(cfg: Config) -> Config:
    """The tiny configuration of the checks, on ``cfg``'s device, precision and attention."""
    keep = [f"experiment.device={cfg.experiment.device}", f"model.attention={cfg.model.attention}"]
    if hasattr(cfg.experiment, "precision"):
        keep.append(f"experiment.precision={cfg.experiment.precision}")
    return dataclasses.replace(load_config(None, [*TINY, *keep]), data=DATA)


def run_device_check(cfg: Config, work_dir: Path,
                     only: Sequence[str] = CHECKS) -> list[CheckResult]:
    """Run the ``only`` checks (in :data:`CHECKS` order) in ``work_dir``; one result each."""
    ctx = _Context(check_config(cfg), resolve_device(cfg.experiment.device), Path(work_dir))
    results = []
    for name in (n for n in CHECKS if n in only):
        started = time.perf_counter()
        try:
            result = _RUNS[name](ctx)
        except Exception as exc:  # a failing check is reported; the others still run
            log.debug("check %s failed", name, exc_info=True)
            text = str(exc).strip().splitlines()
            result = CheckResult(name, "fail", detail=f"{type(exc).__name__}: "
                                                      f"{text[0] if text else ''}"[:300])
        result.figures["seconds"] = round(time.perf_counter() - started, 2)
        results.append(result)
    return results


def _ms(fn: Callable[[], Any], device: torch.device, repeats: int = 3) -> float:
    """Mean wall time of ``fn`` in ms over ``repeats`` calls after one warm-up call."""
    fn()
    synchronize(device)
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize(device)
    return round((time.perf_counter() - started) / repeats * 1000, 3)


def _max_diff(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float:
    return max(float((a.detach().float() - b.detach().float()).abs().max()) for a, b in pairs)


# --------------------------------------------------------------------------- training


def _metrics(run: Path) -> list[dict[str, Any]]:
    from ..run_layout import RunLayout

    return [json.loads(line) for line in RunLayout.at(run).metrics.read_text().splitlines()]


def _whole_run(ctx: _Context) -> Path:
    from ..run_layout import RunLayout
    from ..train.job import train_segment

    out = RunLayout.at(ctx.work / "whole").snapshot(STEPS)
    if not out.exists():
        train_segment(ctx.cfg, ctx.pack(), None, STEPS, out)
    return out


def _train_steps(ctx: _Context) -> CheckResult:
    from ..model.flex import decided_kernel

    out = _whole_run(ctx)
    rows = _metrics(out.parents[1])
    segment = json.loads((out / "trainer_state.json").read_text())["segments"][-1]
    losses = [float(m["loss"]) for m in rows]
    tokens = STEPS * ctx.cfg.train.global_batch_rows * ctx.cfg.data.seq_len
    figures = {"precision": ctx.precision, "attention": decided_kernel() or "sdpa",
               "first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4),
               "tokens_per_s": round(tokens / max(segment["loop_time_s"], 1e-9))}
    ok = len(losses) == STEPS and all(math.isfinite(v) for v in losses)
    return CheckResult("train_steps", "pass" if ok else "fail", figures,
                       "" if ok else f"losses {losses}")


def _snapshot_resume(ctx: _Context) -> CheckResult:
    from ..checkpoint.manifest import verify_snapshot
    from ..checkpoint.snapshot import load_model_state
    from ..run_layout import RunLayout
    from ..train.job import train_segment

    whole = _whole_run(ctx)
    layout = RunLayout.at(ctx.work / "split")
    half = train_segment(ctx.cfg, ctx.pack(), None, STEPS // 2, layout.snapshot(STEPS // 2))
    verify_snapshot(half)
    split = train_segment(ctx.cfg, ctx.pack(), half, STEPS, layout.snapshot(STEPS))
    a, b = _metrics(whole.parents[1]), _metrics(layout.run_dir)
    same_losses = [m["loss"] for m in a] == [m["loss"] for m in b]
    wa, wb = load_model_state(whole), load_model_state(split)
    diff = _max_diff([(wa[k], wb[k]) for k in wa])
    figures = {"losses_identical": same_losses, "max_weight_diff": diff, "tensors": len(wa)}
    ok = same_losses and diff == 0.0 and wa.keys() == wb.keys()
    return CheckResult("snapshot_resume", "pass" if ok else "fail", figures,
                       "" if ok else "2 + 2 steps differ from 4 steps in one segment")


# --------------------------------------------------------------------------- kernels


def _twins(ctx: _Context) -> tuple[Any, Any]:
    from ..model.looped import LoopedLM

    torch.manual_seed(0)
    base = ModelConfig(vocab_size=256, d_model=64, n_heads=4, loops=2, coda_layers=0)
    flex = LoopedLM(dataclasses.replace(base, attention="flex")).to(ctx.device)
    sdpa = LoopedLM(dataclasses.replace(base, attention="sdpa")).to(ctx.device)
    sdpa.load_state_dict(flex.state_dict())
    return flex, sdpa


def _rows(length: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (2, length), generator=gen)
    doc = torch.zeros(2, length, dtype=torch.long)
    doc[0, length // 3:] = 1
    return {"input_ids": ids.to(device), "doc_ids": doc.to(device)}


def _flex_attention(ctx: _Context) -> CheckResult:
    from torch._dynamo.utils import counters

    from ..model import flex as flex_mod

    flex_mod.reset_flex_decision()
    try:
        flex, sdpa = _twins(ctx)
        counters.clear()
        graphs, pairs = [], []
        with torch.no_grad(), ctx.autocast():
            for length in LENGTHS:
                batch = _rows(length, ctx.device)
                pairs.append((flex.logits_at(batch, 2), sdpa.logits_at(batch, 2)))
                graphs.append(counters["stats"]["unique_graphs"])
            if flex_mod.decided_kernel() != "flex":
                return CheckResult("flex_attention", "fail", {"kernel": "sdpa"},
                                   flex_mod.attention_tags().get("loopline.attention_fallback", ""))
            batch = _rows(LENGTHS[-1], ctx.device)
            figures = {"kernel": "flex", "max_diff": _max_diff(pairs), "graphs": graphs[-1],
                       "recompiles_after_first_length": graphs[-1] - graphs[0],
                       "flex_ms": _ms(lambda: flex.logits_at(batch, 2), ctx.device),
                       "sdpa_ms": _ms(lambda: sdpa.logits_at(batch, 2), ctx.device)}
        if ctx.device.type != "cpu":
            figures["grad_diff"] = _grad_diff(ctx, flex, sdpa)
        tol = ctx.tolerance()
        ok = (figures["max_diff"] <= tol and figures["recompiles_after_first_length"] == 0
              and figures.get("grad_diff", 0.0) <= tol)
        return CheckResult("flex_attention", "pass" if ok else "fail", figures,
                           "" if ctx.device.type != "cpu" else "forward only: no CPU backward")
    finally:
        flex_mod.reset_flex_decision()


def _grad_diff(ctx: _Context, flex: Any, sdpa: Any) -> float:
    batch = {**_rows(LENGTHS[1], ctx.device), "targets": _rows(LENGTHS[1], ctx.device, 1)[
        "input_ids"]}
    grads = []
    for model in (flex, sdpa):
        model.zero_grad()
        with ctx.autocast():
            model.losses(batch, [2])[2].backward()
        grads.append([p.grad for p in model.parameters()])
    return _max_diff(list(zip(*grads, strict=True)))


def _moe_grouped_mm(ctx: _Context) -> CheckResult:
    from ..model import moe

    if not hasattr(torch, "_grouped_mm"):
        return CheckResult("moe_grouped_mm", "skip", detail="torch has no _grouped_mm")
    dtype = ctx.dtype()
    moe.reset_grouped_mm_choices()
    try:
        if not moe.grouped_mm_works(ctx.device, dtype):
            return CheckResult("moe_grouped_mm", "fail", {"dtype": str(dtype)},
                               "the grouped GEMM probe failed (see the log)")
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(4, 128, 64, generator=gen).to(ctx.device, dtype)
        layer = moe.MoEFFN(64, 64, 8, 2, 0.0, 0.0)
        layer.reset_parameters(0.1, 0.05)
        layer = layer.to(ctx.device, dtype)
        outs, times = {}, {}
        for impl in ("grouped", "loop"):
            layer.expert_impl = impl

            def step() -> list[torch.Tensor]:
                layer.zero_grad()
                xi = x.clone().requires_grad_(True)
                y = layer(xi)
                y.float().square().mean().backward()
                return [y, xi.grad, layer.w_gate.grad, layer.w_down.grad]

            outs[impl], times[impl] = step(), _ms(step, ctx.device)
        odd = moe.MoEFFN(64, 58, 8, 2, 0.0, 0.0)  # unaligned rows: the loop, after a warning
        odd.reset_parameters(0.1, 0.05)
        odd = odd.to(ctx.device, dtype)
        with torch.no_grad():
            odd(x)
        paths = moe.expert_paths()
        figures = {"dtype": str(dtype).removeprefix("torch."),
                   "max_diff": _max_diff(list(zip(outs["grouped"], outs["loop"], strict=True))),
                   "grouped_ms": times["grouped"], "loop_ms": times["loop"],
                   "width_58": next((v for k, v in paths.items() if k.startswith("64x58")), "?")}
        ok = figures["max_diff"] <= ctx.tolerance() and figures["width_58"] == "loop"
        return CheckResult("moe_grouped_mm", "pass" if ok else "fail", figures)
    finally:
        moe.reset_grouped_mm_choices()


def _generation(ctx: _Context) -> CheckResult:
    from ..data.tokenizer import EOS_TOKEN, load_tokenizer
    from ..model.generate import greedy_decode
    from ..model.looped import LoopedLM
    from ..train.evaluation import generate_samples

    pack, tokens = ctx.pack(), 32
    tok = load_tokenizer(pack)
    torch.manual_seed(0)
    cfg = dataclasses.replace(ctx.cfg.model, vocab_size=tok.get_vocab_size(), moe_experts=0)
    model = LoopedLM(cfg).to(ctx.device).eval()
    prompt = ctx.cfg.train.sample_prompts[0]
    with ctx.autocast():
        started = time.perf_counter()
        [record] = generate_samples(model, pack, [prompt], tokens, step=0, loops=cfg.loops,
                                    context_len=ctx.cfg.data.seq_len, device=ctx.device)
        path_s = time.perf_counter() - started

        def next_ids(_: list[int], rows: list[list[int]]) -> list[int]:
            with torch.no_grad():
                ids = torch.tensor(rows, device=ctx.device)
                return model.logits_at(ids, cfg.loops)[:, -1].argmax(dim=-1).tolist()

        started = time.perf_counter()
        ids = tok.encode(prompt, add_special_tokens=False).ids
        [(reference, _)] = greedy_decode(next_ids, [ids], [tokens],
                                         eos_id=tok.token_to_id(EOS_TOKEN),
                                         context_len=ctx.cfg.data.seq_len)
        reference_s = time.perf_counter() - started
    same = record["completion_ids"] == reference
    figures = {"new_tokens": len(reference), "identical": same,
               "tokens_per_s": round(len(reference) / max(path_s, 1e-9), 1),
               "reference_tokens_per_s": round(len(reference) / max(reference_s, 1e-9), 1)}
    return CheckResult("generation", "pass" if same else "fail", figures)


_RUNS: dict[str, Callable[[_Context], CheckResult]] = {
    "train_steps": _train_steps, "snapshot_resume": _snapshot_resume,
    "flex_attention": _flex_attention, "moe_grouped_mm": _moe_grouped_mm,
    "generation": _generation}


def describe_device(name: str) -> dict[str, str]:
    """``experiment.device``, what it resolved to, its model name (CUDA) and torch's version."""
    device = resolve_device(name)
    info = {"device": name, "resolved": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
    return info


def format_report(results: Sequence[CheckResult], device: dict[str, str]) -> str:
    """The results as an aligned text table (check, status, figures, detail)."""
    where = ", ".join(f"{k} {v}" for k, v in device.items())
    lines = [f"device check: {where}", f"{'check':<16} {'status':<6} figures"]
    for r in results:
        figures = ", ".join(f"{k}={v}" for k, v in r.figures.items())
        lines.append(f"{r.name:<16} {r.status:<6} {figures}" + (f"  ({r.detail})" if r.detail
                                                                  else ""))
    return "\n".join(lines)
