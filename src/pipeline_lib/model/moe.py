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
experts) when it exists and works on the device, or through a per-expert loop.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger(__name__)

_grouped_mm_ok: dict[tuple[str, torch.dtype], bool] = {}


def grouped_mm_works(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` runs (forward and backward) and is right on ``device``.

    Probed once per (device type, dtype) with fixed inputs (no RNG use: probing must not
    shift the random stream of a run).
    """
    if not hasattr(torch, "_grouped_mm"):
        return False
    key = (device.type, dtype)
    if key not in _grouped_mm_ok:
        x = (torch.arange(32 * 16, device=device) % 7 - 3).reshape(32, 16).to(dtype) / 4
        w = (torch.arange(2 * 16 * 16, device=device) % 5 - 2).reshape(2, 16, 16).to(dtype) / 4
        offs = torch.tensor([16, 32], dtype=torch.int32, device=device)
        try:
            w.requires_grad_(True)
            y = torch._grouped_mm(x, w, offs=offs)
            y.backward(torch.ones_like(y))
            ref = torch.cat([x[:16] @ w[0], x[16:] @ w[1]])
            ok = bool(torch.allclose(y.float(), ref.float(), atol=1e-2, rtol=1e-2))
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
            log.info("torch._grouped_mm unusable on %s/%s (%s); using the per-expert loop",
                     device.type, dtype, str(exc).splitlines()[0] if str(exc) else exc)
            ok = False
        _grouped_mm_ok[key] = ok
    return _grouped_mm_ok[key]


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
        """Count loads and record the aux loss term (training mode only)."""
        if self.training:
            self.load_counts += counts.detach()
            if self.aux_loss_weight > 0 and torch.is_grad_enabled():
                frac = counts.float() / top_idx.numel()  # f_e, no gradient (as in Switch)
                self.aux_terms.append(self.n_experts * (frac * probs.mean(dim=0)).sum())

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

    def _use_grouped(self, xs: Tensor) -> bool:
        if self.expert_impl == "loop":
            return False
        if self.expert_impl == "grouped":
            return True
        return grouped_mm_works(xs.device, xs.dtype)

    def forward(self, x: Tensor) -> Tensor:
        B, L, D = x.shape
        flat = x.reshape(B * L, D)  # [N, D]
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
        ys = self._experts(xs, counts, self._use_grouped(xs))  # [N·k, D]
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        y = ys[inverse].view(N, k, D)  # back to token order
        y = (y * gates[..., None].to(y.dtype)).sum(dim=1)  # [N, D]
        return y.view(B, L, D)

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
        counts = (self.load_counts if counts is None else counts).to(torch.float64)
        total = float(counts.sum())
        if total > 0:
            load = counts / total
            self.last_load.copy_(load)
            if self.bias_update_rate > 0:
                self.balance_bias += (self.bias_update_rate * (1.0 / self.n_experts - load)).to(
                    self.balance_bias.dtype)
        self.load_counts.zero_()

    def current_load(self) -> Tensor:
        """Fraction of assignments per expert [E]: since the last update, else of the last one."""
        total = int(self.load_counts.sum())
        if total == 0:
            return self.last_load.clone()
        return self.load_counts.double().div(total).float()

