"""LoopedLM: embedding → prelude → core × H (input injection) → coda → final norm → head.

A forward pass runs the core loop by loop and reads out after any listed loop count t:
readout(t) = head(norm(coda(state_t))). Loop t never depends on the total count, so the
losses at H_eff = 1, 2, 4, 8 from one pass are exactly the losses of four separate passes
(the H_eff sweep and deep supervision rest on this).

Entry points (shapes: B rows, L tokens, D width, V vocab):
- ``model(batch, readouts, answer_weight, no_grad_loops=, start=, state=, answer_only=)
  -> LoopOutput`` (losses per listed loop count and the state after the last one);
  ``model.losses(...)`` returns just the dict. Under FSDP call the module (``model(...)``)
  so its hooks run. ``answer_only`` scores the answer tokens (``answer_mask``) alone.
- Segmented/truncated backprop pieces: ``embed(batch) -> LoopContext``,
  ``forward_loops(ctx, start, end, state, no_grad_loops=) -> state``,
  ``readout_loss(state, ctx, answer_weight, answer_only=) -> loss``.
- ``logits_at(batch_or_input_ids, h_eff) -> [B, L, V]`` for generation and scoring.
- Cached generation (:mod:`.kv_cache`): ``prefill(ids, h_eff, lengths) -> (logits [B, V],
  cache)``, then ``decode_step(cache, tokens [B]) -> logits [B, V]`` per new token.
- MoE (:class:`.moe.MoEHost`): ``take_aux_loss()``, ``update_moe_biases()``, ``clear_moe_loads()``,
  ``moe_load_stats()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..spec.config_model import ModelConfig
from ..spec.size import check_model_config, loop_gate_rows, resolved_head_dim, step_embedding_rows
from .attention import DocumentMask, resolve_attention_kernel
from .blocks import Block, fan_in_init, residual_out_std
from .distill import DistillTarget
from .exit_gate import expected_exit_forward
from .kv_cache import KVCache, kv_decode_step, kv_prefill
from .layers import RMSNorm, RopeScaling, rope_tables
from .loss import readout_cross_entropy, token_weights
from .moe import MoEHost
from .recompute import checkpointed
from .recurrence import gated_update, initial_state

Batch = Mapping[str, Tensor]


@dataclass
class LoopContext:
    """What every loop and readout of one batch shares (built once per batch)."""

    rope: tuple[Tensor, Tensor]  # cos, sin: [B, L, 1, head_dim/2]
    mask: DocumentMask | KVCache  # document-causal attention mask (or a decoding KV cache)
    targets: Tensor | None  # [B, L] next-token ids, IGNORE_INDEX = ignored
    answer_mask: Tensor | None  # [B, L] bool, answer tokens (and the EOS after them)
    positions: Tensor | None = None  # [B, L] position of each token in its document
    e: Tensor | None = None  # [B, L, D] prelude output, injected at every loop


@dataclass
class LoopOutput:
    """Result of ``LoopedLM.forward``."""

    losses: dict[int, Tensor]  # loop count → mean (weighted) loss, fp32 scalar
    state: Tensor  # [B, L, D] loop state after the last loop run
    objective: Tensor | None = None  # expected-exit loss (forward's exit_entropy_weight)


class LoopedLM(MoEHost, nn.Module):
    """Looped (recurrent-depth) transformer language model; see the module docstring."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        check_model_config(cfg)
        self.cfg = cfg
        self.rope_scaling = RopeScaling.of(cfg)
        d, v = cfg.d_model, cfg.vocab_size
        self.tok_emb = nn.Embedding(v, d)
        self.prelude = nn.ModuleList(Block(cfg) for _ in range(cfg.prelude_layers))
        self.core = nn.ModuleList(Block(cfg) for _ in range(cfg.core_layers))
        self.coda = nn.ModuleList(Block(cfg) for _ in range(cfg.coda_layers))
        self.norm = RMSNorm(d, cfg.norm_eps)
        self.head = None if cfg.tie_embeddings else nn.Linear(d, v, bias=False)
        self.injection_proj = nn.Linear(2 * d, d, bias=False) if cfg.injection == "linear" else None
        scale = torch.tensor(float(cfg.injection_scale))
        if cfg.injection == "add" and cfg.learn_injection_scale:
            self.injection_scale = nn.Parameter(scale)  # λ, its own parameter group
        else:  # fixed: config-determined, not saved
            self.register_buffer("injection_scale", scale, persistent=False)
        rows = step_embedding_rows(cfg)
        self.step_emb = nn.Embedding(rows, d) if rows else None
        # absolute positions, added to the token embedding: re-injected with e at every loop
        self.pos_emb = nn.Embedding(cfg.learned_positions, d) if cfg.learned_positions else None
        gates = loop_gate_rows(cfg)  # g_t of gated recurrence (see .recurrence)
        self.loop_gate = nn.Parameter(torch.zeros(gates)) if gates else None
        # one exit logit per token and loop, shared by every loop (see .exit_gate)
        self.exit_gate = nn.Linear(d, 1) if cfg.exit_gate else None
        # train.activation_checkpointing (none | loop | block; see .recompute), set by training
        self.activation_checkpointing = "none"
        self.reset_parameters()

    # ------------------------------------------------------------------ set-up

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights, scaled residual outputs, [I | λI] linear injection,
        loop gates at 0; ``init: fan_in`` redraws the weight matrices (:func:`.blocks.fan_in_init`)."""
        cfg = self.cfg
        std = cfg.init_std
        out_std = residual_out_std(
            std, cfg.prelude_layers + cfg.core_layers * cfg.loops + cfg.coda_layers)
        nn.init.normal_(self.tok_emb.weight, std=std)
        for block in (*self.prelude, *self.core, *self.coda):
            block.reset_parameters(std, out_std)
        if self.head is not None:
            nn.init.normal_(self.head.weight, std=std)
        if self.injection_proj is not None:
            # Starts as additive injection state + λ·e; the map is then learned.
            eye = torch.eye(cfg.d_model)
            self.injection_proj.weight.copy_(torch.cat([eye, cfg.injection_scale * eye], dim=1))
        if self.step_emb is not None:
            nn.init.normal_(self.step_emb.weight, std=std)
        if self.pos_emb is not None:
            nn.init.normal_(self.pos_emb.weight, std=std)
        if cfg.init == "fan_in":  # the blocks, an untied head and the linear injection
            fan_in_init([*self.prelude, *self.core, *self.coda, self.head, self.injection_proj])
        if self.loop_gate is not None:  # loops after the first start as no-ops
            nn.init.zeros_(self.loop_gate)
        if self.exit_gate is not None:  # λ ≈ 0.5 at every loop at the start
            nn.init.normal_(self.exit_gate.weight, std=std)
            nn.init.zeros_(self.exit_gate.bias)

    @property
    def head_weight(self) -> Tensor:
        """Output projection [V, D] (the token embedding when tied)."""
        return self.tok_emb.weight if self.head is None else self.head.weight

    # ------------------------------------------------------------------ batch → context

    def context(self, batch: Batch | Tensor, mask: DocumentMask | KVCache | None = None
                ) -> LoopContext:
        """RoPE tables and the document mask of a batch (no embedding yet).

        ``batch`` is the loader's dict or bare ``input_ids`` [B, L]; missing
        ``position_ids`` default to 0..L-1 and missing ``doc_ids`` to one document per row.
        ``mask``: use this one instead (a decoding step's KV cache).
        """
        if isinstance(batch, Tensor):
            batch = {"input_ids": batch}
        ids = batch["input_ids"]
        B, L = ids.shape
        pos = batch.get("position_ids")
        if pos is None:
            pos = torch.arange(L, device=ids.device).expand(B, L)
        # (in training the config check holds positions in the table: no host sync per step)
        if (self.pos_emb is not None and not self.training and pos.numel()
                and int(pos.max()) >= self.pos_emb.num_embeddings):
            raise ValueError(f"position {int(pos.max())} is past model.learned_positions = "
                             f"{self.pos_emb.num_embeddings} (the learned position table); "
                             "use shorter inputs or a model trained with a larger table")
        if mask is None:
            doc = batch.get("doc_ids")
            if doc is None:
                doc = torch.zeros_like(ids)
            mask = DocumentMask.build(doc, resolve_attention_kernel(self.cfg.attention,
                                                                    ids.device))
        return LoopContext(
            rope=rope_tables(pos, resolved_head_dim(self.cfg), self.cfg.rope_theta,
                             self.rope_scaling),
            mask=mask,
            targets=batch.get("targets"),
            answer_mask=batch.get("answer_mask"),
            positions=pos,
        )

    def embed(self, batch: Batch | Tensor, ctx: LoopContext | None = None) -> LoopContext:
        """Context of ``batch`` with ``ctx.e`` = prelude(embedding) [B, L, D].

        Starts a new forward pass: MoE aux-loss terms not yet taken are dropped. ``ctx``: a
        context built by the caller (cached generation: its mask is the KV cache).
        """
        ctx = self.context(batch) if ctx is None else ctx
        ids = batch if isinstance(batch, Tensor) else batch["input_ids"]
        self._drop_aux_terms()
        x = self.tok_emb(ids)
        if self.pos_emb is not None:  # a decoding step's ids are [B], its positions [B, 1]
            x = x + self.pos_emb(ctx.positions.reshape(ids.shape))
        ctx.e = self._piece("loop", self._blocks, self.prelude, x, ctx)
        return ctx

    def init_state(self, ctx: LoopContext) -> Tensor:
        """Loop state before loop 1 (``state_init``, see :mod:`.recurrence`)."""
        assert ctx.e is not None, "embed() the batch first"
        return initial_state(self.cfg, ctx.e, self.training)

    # ------------------------------------------------------------------ loops

    def _piece(self, level: str, fn, *args):
        """``fn(*args)``, checkpointed when ``activation_checkpointing`` is ``level``."""
        if self.activation_checkpointing == level:
            return checkpointed(fn, *args)
        return fn(*args)

    def _blocks(self, blocks: nn.ModuleList, x: Tensor, ctx: LoopContext) -> Tensor:
        """x [B, L, D] through ``blocks`` (each checkpointed alone at level ``block``)."""
        for block in blocks:
            x = self._piece("block", block, x, ctx.rope, ctx.mask)
        return x

    def _loop(self, state: Tensor, ctx: LoopContext, t: int) -> Tensor:
        """Loop t (0-based): inject e into the state, run the core blocks (gated
        recurrence: add their gated increment to the state after loop 0)."""
        if self.injection_proj is not None:
            x = self.injection_proj(torch.cat([state, ctx.e], dim=-1))  # W[state; e]
        else:
            x = state + self.injection_scale.to(state.dtype) * ctx.e
        if self.step_emb is not None:  # loops past the table reuse its last row
            x = x + self.step_emb.weight[min(t, self.step_emb.num_embeddings - 1)]
        out = self._blocks(self.core, x, ctx)
        if self.loop_gate is None or t == 0:
            return out
        return gated_update(state, x, out, self.loop_gate, t)

    def forward_loops(self, ctx_or_batch: LoopContext | Batch, start: int, end: int,
                      state: Tensor | None = None, *, no_grad_loops: int = 0) -> Tensor:
        """Run loops start+1 … end on ``state`` [B, L, D] (None at start 0: init_state).

        The first ``no_grad_loops`` of them run without autograd (truncated backprop).
        A batch (instead of a context) is embedded first; unrolled backprop should pass a
        fresh context per unroll, since the previous unroll's graph has been freed.
        """
        ctx = ctx_or_batch if isinstance(ctx_or_batch, LoopContext) else self.embed(ctx_or_batch)
        if not 0 <= start <= end:
            raise ValueError(f"need 0 <= start <= end, got start={start}, end={end}")
        if state is None:
            if start != 0:
                raise ValueError(f"state is required when start = {start} > 0")
            state = self.init_state(ctx)
        n_free = min(max(no_grad_loops, 0), end - start)
        if n_free:
            with torch.no_grad():
                for t in range(start, start + n_free):
                    state = self._loop(state, ctx, t)
        for t in range(start + n_free, end):
            state = self._piece("loop", self._loop, state, ctx, t)
        return state

    # ------------------------------------------------------------------ readout

    def readout_hidden(self, state: Tensor, ctx: LoopContext) -> Tensor:
        """norm(coda(state)) [B, L, D]: what the head reads."""
        return self._piece("loop", self._coda_norm, state, ctx)

    def _coda_norm(self, state: Tensor, ctx: LoopContext) -> Tensor:
        return self.norm(self._blocks(self.coda, state, ctx))

    def readout_logits(self, state: Tensor, ctx: LoopContext) -> Tensor:
        """Logits [B, L, V] of a loop state (materialised: for generation and scoring)."""
        return F.linear(self.readout_hidden(state, ctx), self.head_weight)

    def readout_loss(self, state: Tensor, ctx_or_batch: LoopContext | Batch,
                     answer_weight: float = 1.0, *, answer_only: bool = False,
                     distill: DistillTarget | None = None) -> Tensor:
        """Mean next-token loss of a loop state; answer tokens weighted by ``answer_weight``.

        Weighted mean Σ wᵢ·ceᵢ / Σ wᵢ over non-ignored targets (w = answer_weight on
        ``answer_mask``, else 1), via the chunked loss (no [B·L, V] logits). With
        ``answer_only`` w is 1 on ``answer_mask`` and 0 elsewhere: the mean loss of the
        answer tokens (0, with zero gradients, in a batch without any). ``distill``: plus
        the KL term to its teacher on the same tokens and weights (:mod:`.distill`).
        """
        ctx = ctx_or_batch if isinstance(ctx_or_batch, LoopContext) else self.context(ctx_or_batch)
        if ctx.targets is None:
            raise ValueError("the batch has no 'targets'; readout_loss needs them")
        h = self.readout_hidden(state, ctx)  # [B, L, D]
        flat, targets = h.reshape(-1, h.shape[-1]), ctx.targets.reshape(-1)
        weights = token_weights(ctx.answer_mask, answer_weight, answer_only)
        loss = readout_cross_entropy(flat, self.head_weight, targets,
                                     chunk_size=self.cfg.loss_chunk_size, token_weights=weights)
        return loss if distill is None else loss + distill.term(
            flat, self.head_weight, targets, weights, self.cfg.loss_chunk_size)

    # ------------------------------------------------------------------ full passes

    def forward(self, batch: Batch | LoopContext, readouts: Sequence[int],
                answer_weight: float = 1.0, *, no_grad_loops: int = 0, start: int = 0,
                state: Tensor | None = None, answer_only: bool = False,
                exit_entropy_weight: float | None = None, distill: DistillTarget | None = None
                ) -> LoopOutput:
        """Losses after each listed loop count, from one pass over the loops.

        Counts may exceed ``cfg.loops`` (test-time extrapolation). ``start``/``state``
        continue from a previous unroll's (detached) state, so counts must exceed
        ``start``; ``no_grad_loops`` loops after ``start`` run without gradients.
        ``exit_entropy_weight`` (β, needs the exit gate, start 0): also the expected-exit
        objective over the readouts (:mod:`.exit_gate`) as ``objective``. ``distill``:
        every listed readout's loss gains its KL term to the teacher (:mod:`.distill`).
        """
        wanted = sorted(set(int(h) for h in readouts))
        if not wanted or wanted[0] <= start:
            raise ValueError(f"readouts must be a non-empty list of counts > start={start}, "
                             f"got {list(readouts)}")
        ctx = batch if isinstance(batch, LoopContext) else self.embed(batch)
        if exit_entropy_weight is not None:
            assert start == 0 and state is None, "expected exit reads out from loop 1"
            weights = token_weights(ctx.answer_mask, answer_weight, answer_only)
            out, objective, state = expected_exit_forward(
                self, ctx, wanted, weights, exit_entropy_weight, no_grad_loops=no_grad_loops)
            return LoopOutput({int(h): out[int(h)] for h in readouts}, state, objective)
        out: dict[int, Tensor] = {}
        t = start
        for h in wanted:
            free = max(0, min(no_grad_loops - (t - start), h - t))
            state = self.forward_loops(ctx, t, h, state, no_grad_loops=free)
            out[h] = self.readout_loss(state, ctx, answer_weight, answer_only=answer_only,
                                       distill=distill)
            t = h
        assert state is not None
        return LoopOutput(losses={int(h): out[int(h)] for h in readouts}, state=state)

    def losses(self, batch: Batch, readouts: Sequence[int], answer_weight: float = 1.0, *,
               no_grad_loops: int = 0, answer_only: bool = False) -> dict[int, Tensor]:
        """``{h: loss after h loops}`` for every h in ``readouts``, from one forward pass."""
        return self(batch, readouts, answer_weight, no_grad_loops=no_grad_loops,
                    answer_only=answer_only).losses

    @torch.no_grad()
    def logits_by_loops(self, batch_or_input_ids: Batch | Tensor,
                        readouts: Sequence[int]) -> dict[int, Tensor]:
        """``{h: logits [B, L, V]}`` after each listed loop count, one pass, no gradients."""
        ctx = self.embed(batch_or_input_ids)
        out: dict[int, Tensor] = {}
        state, t = None, 0
        for h in sorted(set(int(h) for h in readouts)):
            state = self.forward_loops(ctx, t, h, state)
            out[h] = self.readout_logits(state, ctx)
            t = h
        return out

    def logits_at(self, batch_or_input_ids: Batch | Tensor, h_eff: int) -> Tensor:
        """Logits [B, L, V] after ``h_eff`` loops (no gradients)."""
        if h_eff < 1:
            raise ValueError(f"h_eff must be at least 1, got {h_eff}")
        return self.logits_by_loops(batch_or_input_ids, [h_eff])[h_eff]

    def prefill(self, batch_or_input_ids: Batch | Tensor, h_eff: int,
                lengths: Tensor | None = None, reserve: int = 0, **options) -> tuple[Tensor, KVCache]:
        """(logits [B, V] at each row's last token, KV cache) after ``h_eff`` loops;
        ``lengths`` [B]: real tokens per right-padded row; ``options``: see :mod:`.kv_cache`."""
        return kv_prefill(self, batch_or_input_ids, h_eff, lengths, reserve, **options)

    def decode_step(self, cache: KVCache, tokens: Tensor) -> Tensor:
        """Logits [B, V] of the next token after appending ``tokens`` [B] (one per row)."""
        return kv_decode_step(self, cache, tokens)
