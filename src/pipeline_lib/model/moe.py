"""Mixture-of-experts SwiGLU FFN: top-k router, dropless, two balancing mechanisms.

- Switch-style auxiliary loss ``E · Σ_e f_e · P_e`` (f_e: fraction of routed assignments to
  expert e, P_e: mean router probability of e), recorded per call while training and
  collected by ``LoopedLM.take_aux_loss()``.
- Aux-loss-free balancing (DeepSeek-V3, arXiv:2408.15664): a per-expert bias added to the
  router scores for *selection only*; after each optimizer step the trainer calls
  ``update_bias`` (through ``LoopedLM.update_moe_biases``): ``bias += γ·(1/E − load)``.
  The bias is a persistent buffer, so it lands in the state dict and survives a resume.

Dropless: every token reaches its k experts. Tokens are sorted by expert (stable sort, so the
order is deterministic) and run either through ``torch._grouped_mm`` (one kernel over all
experts) or through a per-expert loop; both give the same outputs (tested).

When the grouped kernel is used (``expert_impl: auto``):
- :func:`grouped_mm_works` probes it once per (device type, CUDA capability, dtype, with or
  without backward) on fixed 16×16 inputs; the backward is probed only when gradients are on,
  so an evaluation process under ``no_grad``/``inference_mode`` does not conclude it is missing.
- Shape by shape: its operands need rows of a multiple of 16 bytes (CUDA and CPU kernels
  alike: an expert width of 58 in bf16 fails). Expert widths are rounded up to a multiple of
  8 (``spec.size.MOE_WIDTH_MULTIPLE``), and a shape that is still unaligned (a ``d_model``
  that is not a multiple of 8), or whose first grouped call fails, runs the per-expert loop
  from then on, with one warning per shape (and an MLflow tag, :func:`moe_tags`). A shape
  that ran grouped once never switches: a later failure is raised.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .recompute import recomputing

log = logging.getLogger(__name__)

GROUPED_MM_ALIGN_BYTES = 16  # row stride alignment torch._grouped_mm requires
_probed: dict[tuple, bool] = {}  # (device type, capability, dtype, backward) → works
_shapes: dict[tuple, bool] = {}  # (device type, dtype, in, out) → grouped (True) or loop
_fallbacks: dict[tuple, str] = {}  # shapes running the loop → why


def _support_key(device: torch.device, dtype: torch.dtype, backward: bool) -> tuple:
    capability = None
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
    return (device.type, capability, dtype, backward)


def _same_tensor(t: Tensor) -> Tensor:
    return t


def _probe(device: torch.device, dtype: torch.dtype, backward: bool) -> bool:
    x = (torch.arange(32 * 16, device=device) % 7 - 3).reshape(32, 16).to(dtype) / 4
    w = (torch.arange(2 * 16 * 16, device=device) % 5 - 2).reshape(2, 16, 16).to(dtype) / 4
    offs = torch.tensor([16, 32], dtype=torch.int32, device=device)
    # Identity saved-tensor hooks: a probe run inside a checkpointed piece (the first MoE
    # call of a process) saves nothing into it, so its recomputation, which finds the
    # probe cached, saves the same tensors (model.recompute).
    try:
        with (torch.enable_grad() if backward else torch.no_grad(),
              torch.autograd.graph.saved_tensors_hooks(_same_tensor, _same_tensor)):
            x, w = x.requires_grad_(backward), w.requires_grad_(backward)
            y = torch._grouped_mm(x, w, offs=offs)
            ref = torch.cat([x[:16] @ w[0], x[16:] @ w[1]])
            pairs = [(y, ref)]
            if backward:  # a contiguous output gradient, as in training
                seed = torch.ones_like(y)
                pairs += zip(torch.autograd.grad(y, (x, w), seed),
                             torch.autograd.grad(ref, (x, w), seed), strict=True)
        return all(torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1e-2) for a, b in pairs)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
        log.info("torch._grouped_mm unusable on %s/%s%s (%s); using the per-expert loop",
                 device.type, dtype, " with backward" if backward else "",
                 str(exc).splitlines()[0] if str(exc) else exc)
        return False


def grouped_mm_works(device: torch.device, dtype: torch.dtype, *,
                     backward: bool | None = None) -> bool:
    """Whether ``torch._grouped_mm`` runs and is right on ``device`` in ``dtype``: forward,
    and backward when ``backward`` (default: whether gradients are on here).

    Probed once per key of :func:`_support_key`, with fixed inputs (no RNG use: probing must
    not shift the random stream of a run).
    """
    if not hasattr(torch, "_grouped_mm"):
        return False
    backward = torch.is_grad_enabled() if backward is None else backward
    key = _support_key(device, dtype, backward)
    if key not in _probed:
        _probed[key] = _probe(device, dtype, backward)
    return _probed[key]


def grouped_mm_aligned(width_in: int, width_out: int, dtype: torch.dtype) -> bool:
    """Whether [N, in] × [E, in, out] (and its backward) has 16-byte-aligned rows in ``dtype``."""
    per_row = GROUPED_MM_ALIGN_BYTES // torch.empty((), dtype=dtype).element_size()
    return width_in % per_row == 0 and width_out % per_row == 0


def _shape_name(key: tuple) -> str:
    """(device type, dtype, in, out) → ``"16x64 float32 cpu"``."""
    return f"{key[2]}x{key[3]} {str(key[1]).removeprefix('torch.')} {key[0]}"


def _fall_back(key: tuple, reason: str) -> None:
    _shapes[key] = False
    _fallbacks[key] = reason
    log.warning("MoE experts %d→%d in %s on %s: %s; this shape uses the per-expert loop",
                key[2], key[3], str(key[1]).removeprefix("torch."), key[0], reason)


def expert_paths() -> dict[str, str]:
    """Each expert shape this process ran under ``auto`` → ``grouped`` or ``loop``."""
    return {_shape_name(k): "grouped" if grouped else "loop" for k, grouped in _shapes.items()}


def reset_grouped_mm_choices() -> None:
    """Forget the probes and per-shape choices (tests: a process makes them once)."""
    _probed.clear()
    _shapes.clear()
    _fallbacks.clear()


def moe_tags() -> dict[str, str]:
    """MLflow tag naming the expert shapes that fell back to the per-expert loop."""
    if not _fallbacks:
        return {}
    shapes = "; ".join(f"{_shape_name(k)}: {why}" for k, why in _fallbacks.items())
    return {"loopline.moe_grouped_mm_fallback": shapes[:500]}


class MoEFFN(nn.Module):
    """Top-k routed SwiGLU experts. Input and output [B, L, D].

    ``expert_impl``: ``auto`` (grouped when it works, else loop), ``grouped`` or ``loop``.
    """

    def __init__(self, dim: int, hidden: int, n_experts: int, top_k: int,
                 aux_loss_weight: float, bias_update_rate: float) -> None:
        super().__init__()
        assert 1 <= top_k <= n_experts
        self.n_experts, self.top_k = n_experts, top_k
        self.aux_loss_weight, self.bias_update_rate = aux_loss_weight, bias_update_rate
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.w_gate = nn.Parameter(torch.empty(n_experts, dim, hidden))  # [E, D, H]
        self.w_up = nn.Parameter(torch.empty(n_experts, dim, hidden))  # [E, D, H]
        self.w_down = nn.Parameter(torch.empty(n_experts, hidden, dim))  # [E, H, D]
        self.register_buffer("balance_bias", torch.zeros(n_experts))  # selection-only bias
        # Routed assignments per expert since the last bias update (training forwards only).
        self.register_buffer("load_counts", torch.zeros(n_experts, dtype=torch.int64),
                             persistent=False)
        self.register_buffer("last_load", torch.zeros(n_experts), persistent=False)
        self.expert_impl = "auto"
        self.aux_terms: list[Tensor] = []

    def reset_parameters(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.router.weight, std=std)
        nn.init.normal_(self.w_gate, std=std)
        nn.init.normal_(self.w_up, std=std)
        nn.init.normal_(self.w_down, std=out_std)

    # ------------------------------------------------------------------ routing

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [N, D] → expert ids [N, k], gate weights [N, k] (fp32), router probs [N, E]."""
        probs = F.linear(x.float(), self.router.weight.float()).softmax(dim=-1)  # [N, E]
        _, top_idx = torch.topk(probs + self.balance_bias, self.top_k, dim=-1)
        gates = probs.gather(-1, top_idx)  # [N, k]
        if self.top_k > 1:  # with k = 1 the raw probability keeps the router in the gradient
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return top_idx, gates, probs

    def _record(self, top_idx: Tensor, probs: Tensor, counts: Tensor) -> None:
        """Count loads and record the aux loss term (training mode only).

        When activation checkpointing recomputes this call in backward, the term is computed
        again (the recomputation must save the same tensors) but neither it nor the loads
        are recorded a second time.
        """
        if not self.training:
            return
        again = recomputing()
        if not again:
            self.load_counts += counts.detach()
        if self.aux_loss_weight > 0 and torch.is_grad_enabled():
            frac = counts.float() / top_idx.numel()  # f_e, no gradient (as in Switch)
            term = self.n_experts * (frac * probs.mean(dim=0)).sum()
            if not again:
                self.aux_terms.append(term)

    # ------------------------------------------------------------------ experts

    @staticmethod
    def _grouped_matmul(xs: Tensor, w: Tensor, counts: Tensor, grouped: bool) -> Tensor:
        """Rows of expert e (consecutive, ``counts[e]`` of them) times w[e]: [N·k, out]."""
        w = w.to(xs.dtype)
        if grouped:
            return torch._grouped_mm(xs, w, offs=counts.cumsum(0).to(torch.int32))
        return torch.cat([rows @ w[e] for e, rows in enumerate(xs.split(counts.tolist()))])

    def _experts(self, xs: Tensor, counts: Tensor, grouped: bool) -> Tensor:
        # Elementwise ops run once over all rows in both paths: vectorised and scalar-tail
        # code can round differently, and the two paths must agree bit for bit.
        g = self._grouped_matmul(xs, self.w_gate, counts, grouped)  # [N·k, H]
        u = self._grouped_matmul(xs, self.w_up, counts, grouped)  # [N·k, H]
        return self._grouped_matmul(F.silu(g) * u, self.w_down, counts, grouped)  # [N·k, D]

    def _run_experts(self, xs: Tensor, counts: Tensor) -> Tensor:
        """The experts over xs [N·k, D] by ``expert_impl``; ``auto`` decides per shape."""
        if self.expert_impl != "auto":
            return self._experts(xs, counts, grouped=self.expert_impl == "grouped")
        width_in, width_out = self.w_gate.shape[1], self.w_gate.shape[2]
        key = (xs.device.type, xs.dtype, width_in, width_out)
        if _shapes.get(key) is False or not grouped_mm_works(xs.device, xs.dtype):
            return self._experts(xs, counts, grouped=False)
        if key not in _shapes:
            if not grouped_mm_aligned(width_in, width_out, xs.dtype):
                _fall_back(key, f"rows are not multiples of {GROUPED_MM_ALIGN_BYTES} bytes")
                return self._experts(xs, counts, grouped=False)
            try:  # the first call of a shape decides; after it works, failures are raised
                out = self._experts(xs, counts, grouped=True)
            except RuntimeError as exc:
                _fall_back(key, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                return self._experts(xs, counts, grouped=False)
            _shapes[key] = True
            return out
        return self._experts(xs, counts, grouped=True)

    def forward(self, x: Tensor) -> Tensor:
        D = x.shape[-1]
        flat = x.reshape(-1, D)  # [N, D]: every token of x [B, L, D] (or [B, D] when decoding)
        N, k = flat.shape[0], self.top_k
        top_idx, gates, probs = self.route(flat)
        flat_ids = top_idx.reshape(-1)  # [N·k]
        order = torch.argsort(flat_ids, stable=True)  # [N·k], grouped by expert
        # Rows per expert from the sorted ids (bincount has no deterministic CUDA kernel).
        bounds = torch.arange(self.n_experts + 1, device=x.device, dtype=flat_ids.dtype)
        counts = torch.searchsorted(flat_ids[order], bounds).diff()  # [E]
        self._record(top_idx, probs, counts)
        # Replicate each token k times, then permute: backward of both is a plain sum.
        xs = flat[:, None, :].expand(N, k, D).reshape(N * k, D)[order]  # [N·k, D]
        ys = self._run_experts(xs, counts)  # [N·k, D]
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        y = ys[inverse].view(N, k, D)  # back to token order
        y = (y * gates[..., None].to(y.dtype)).sum(dim=1)  # [N, D]
        return y.view(x.shape)

    # ------------------------------------------------------------------ balancing

    def take_aux_terms(self) -> list[Tensor]:
        terms, self.aux_terms = self.aux_terms, []
        return terms

    @torch.no_grad()
    def update_bias(self, counts: Tensor | None = None) -> None:
        """``bias += γ·(1/E − load)`` from the loads since the last update; resets the counts.

        ``counts`` overrides the local counts (the model passes all-reduced counts when
        training is distributed, so every rank applies the same update).
        """
        # float64 on the CPU (Ascend NPUs have no float64), then back to the device
        counts = (self.load_counts if counts is None else counts).detach().cpu().double()
        total = float(counts.sum())
        if total > 0:
            load = counts / total
            self.last_load.copy_(load)
            if self.bias_update_rate > 0:
                step = self.bias_update_rate * (1.0 / self.n_experts - load)
                self.balance_bias += step.to(self.balance_bias.device, self.balance_bias.dtype)
        self.load_counts.zero_()

    def current_load(self) -> Tensor:
        """Fraction of assignments per expert [E]: since the last update, else of the last one."""
        total = int(self.load_counts.sum())
        if total == 0:
            return self.last_load.clone()
        return self.load_counts.cpu().double().div(total).float()


class MoEHost:
    """The MoE bookkeeping of a model whose blocks hold :class:`MoEFFN` layers (LoopedLM's):
    aux-loss terms per forward pass, aux-loss-free bias updates, load statistics. Needs
    ``cfg`` (``moe_experts``, ``moe_aux_loss_weight``), ``named_modules`` and ``tok_emb``."""

    def moe_layers(self) -> list[tuple[str, MoEFFN]]:
        """(name, layer) of every MoE FFN, e.g. ("core.0", …)."""
        return [(name.removesuffix(".ffn"), m) for name, m in self.named_modules()
                if isinstance(m, MoEFFN)]

    def _drop_aux_terms(self) -> None:
        if not self.cfg.moe_experts:  # dense: nothing to drop (skips a walk over the modules)
            return
        for _, layer in self.moe_layers():
            layer.take_aux_terms()

    def take_aux_loss(self) -> Tensor:
        """Weighted MoE load-balancing loss of the current forward pass, then cleared.

        ``moe_aux_loss_weight`` × the mean Switch loss over every MoE call since the last
        ``embed`` (prelude, each core loop, each readout's coda), recorded only in training
        mode with gradients on. Add it to the loss before backward; 0 without MoE.
        """
        terms = [t for _, layer in self.moe_layers() for t in layer.take_aux_terms()]
        if not terms:
            return torch.zeros((), device=self.tok_emb.weight.device)
        return self.cfg.moe_aux_loss_weight * torch.stack(terms).mean()

    @torch.no_grad()
    def update_moe_biases(self) -> None:
        """Aux-loss-free balancing step ``bias += γ·(1/E − load)`` for every MoE layer.

        Uses the loads of all training forwards since the last update (summed over ranks
        when torch.distributed is initialised) and resets them. Call after each optimizer
        step; on a skipped step call ``clear_moe_loads()`` instead.
        """
        layers = self.moe_layers()
        if not layers:
            return
        counts = torch.stack([layer.load_counts for _, layer in layers])  # [layers, E]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(counts)
        for (_, layer), c in zip(layers, counts, strict=True):
            layer.update_bias(c)

    @torch.no_grad()
    def clear_moe_loads(self) -> None:
        """Forget the loads counted since the last update (e.g. of a skipped step)."""
        for _, layer in self.moe_layers():
            layer.load_counts.zero_()

    def moe_load_stats(self) -> dict[str, float]:
        """``{"moe_load/<layer>/e<i>": fraction, "moe_load/<layer>/max": …}`` for logging.

        Loads since the last bias update, or those of the last update when none since;
        balanced routing gives 1/E per expert.
        """
        stats: dict[str, float] = {}
        for name, layer in self.moe_layers():
            load = layer.current_load().tolist()
            for i, value in enumerate(load):
                stats[f"moe_load/{name}/e{i}"] = float(value)
            stats[f"moe_load/{name}/max"] = float(max(load))
        return stats
