"""A loopline looped transformer as a 🤗 transformers model (remote code: torch + transformers).

``python -m pipeline_lib export`` copies this file, unchanged, next to ``config.json`` and
``model.safetensors``, so that::

    model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
    model(input_ids, num_loops=8).logits          # read out after 8 core loops
    model.generate(input_ids, num_loops=8, max_new_tokens=20)

works without loopline installed. It must import nothing but torch and transformers.

The model: embedding → prelude blocks → core blocks applied ``num_loops`` times with input
injection (state ← core(state + λ·e), or core(W[state; e])) → coda blocks → final RMSNorm →
head. ``config.num_loops`` is the training loop count and the default; any count ≥ 1 may be
passed to ``forward`` and ``generate``. Module names equal loopline's ``LoopedLM``, so the
weights are its state dict as is. Logits equal ``LoopedLM.logits_at`` (fp32, tested).

Grouped-query attention (``num_key_value_heads`` < ``num_attention_heads``, as Llama's):
query head i reads key/value head i // (heads / kv heads); the fused ``qkv`` projection holds
all q heads, then all k heads, then all v heads. RoPE frequencies may be scaled as
transformers' ``linear`` and ``llama3`` rope types do (``rope_scaling_type`` and the
``rope_*`` keys of config.json). Exports written before these keys existed load as plain
multi-head attention with unscaled RoPE.

``attention_mask`` marks padding (left or right): padded keys are never attended to and
positions count real tokens only, so a padded row gives the logits of the unpadded one.

``generate`` keeps a KV cache (:class:`LoopKVCache`, ``use_cache``, on by default): the keys
and values of every attention call — prelude blocks, each core block once per loop (every
loop sees a different state), coda blocks — so each step runs only the new token. A cache
is bound to the loop count it was filled with. Greedy, sampling and beam search (the cache
reorders) work with it; assisted decoding does not; ``use_cache=False`` recomputes the
window every step. A learned exit gate (``exit_gate`` in config.json) is loaded as
``exit_gate`` but not applied: forward and generate run a fixed loop count.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast


class LooplineConfig(PretrainedConfig):
    """Shape of a loopline model; ``num_loops`` is the default core loop count."""

    model_type = "loopline"

    def __init__(self, vocab_size: int = 258, hidden_size: int = 128,
                 num_attention_heads: int = 4, prelude_layers: int = 1, core_layers: int = 1,
                 coda_layers: int = 1, num_loops: int = 4, intermediate_size: int = 352,
                 moe_experts: int = 0, moe_top_k: int = 2, moe_intermediate_size: int = 0,
                 injection: str = "add", injection_scale: float = 1.0,
                 step_embedding_rows: int = 0, state_init: str = "zeros",
                 tie_embeddings: bool = True, rope_theta: float = 10000.0,
                 rms_norm_eps: float = 1e-6, max_position_embeddings: int = 256,
                 num_key_value_heads: int | None = None, rope_scaling_type: str = "none",
                 rope_scaling_factor: float = 1.0, rope_low_freq_factor: float = 1.0,
                 rope_high_freq_factor: float = 4.0, rope_original_max_position: int = 8192,
                 **kwargs) -> None:
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        # Not transformers' rope_scaling / rope_parameters (its own): this model computes its tables.
        self.rope_scaling_type, self.rope_scaling_factor = rope_scaling_type, rope_scaling_factor
        self.rope_low_freq_factor, self.rope_high_freq_factor = (rope_low_freq_factor,
                                                                 rope_high_freq_factor)
        self.rope_original_max_position = rope_original_max_position
        self.prelude_layers, self.core_layers = prelude_layers, core_layers
        self.coda_layers, self.num_loops = coda_layers, num_loops
        self.intermediate_size, self.moe_intermediate_size = intermediate_size, moe_intermediate_size
        self.moe_experts, self.moe_top_k = moe_experts, moe_top_k
        self.injection, self.injection_scale = injection, injection_scale
        self.step_embedding_rows, self.state_init = step_embedding_rows, state_init
        self.tie_embeddings, self.rope_theta = tie_embeddings, rope_theta
        self.rms_norm_eps, self.max_position_embeddings = rms_norm_eps, max_position_embeddings
        # The model reads the tied head from tok_emb itself; transformers must not tie.
        kwargs["tie_word_embeddings"] = False
        super().__init__(**kwargs)


def rope_inv_freq(config: LooplineConfig, device: torch.device) -> torch.Tensor:
    """RoPE frequencies [head_dim/2] in fp64: θ^(−2i/head_dim), scaled like transformers'
    ``linear`` (all / factor) or ``llama3`` (``_compute_llama3_parameters``) rope types."""
    half = config.hidden_size // config.num_attention_heads // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64,
                                                         device=device) / half))
    kind, factor = config.rope_scaling_type, config.rope_scaling_factor
    if kind == "linear":
        return inv_freq / factor
    if kind != "llama3":
        return inv_freq
    old, low, high = (config.rope_original_max_position, config.rope_low_freq_factor,
                      config.rope_high_freq_factor)
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def rope_tables(position_ids: torch.Tensor, config: LooplineConfig
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, L, 1, head_dim/2] (fp32, angles computed in fp64)."""
    inv_freq = rope_inv_freq(config, position_ids.device)
    angles = position_ids.to(torch.float64)[..., None] * inv_freq  # [B, L, half]
    return angles.cos().float()[:, :, None], angles.sin().float()[:, :, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+half}) of x [B, L, H, head_dim]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class LoopKVCache:
    """Keys and values [B, KV, T, hd] of every attention call of a forward pass, in call order
    (prelude blocks; core blocks, loop by loop; coda blocks), for one loop count.

    A forward pass calls :meth:`update` once per attention call, in the same order every
    time: the call's new keys and values are appended and all of them returned.
    """

    is_compileable = False  # generate() must not try to compile around it
    is_croppable = False  # assisted decoding, which crops, is not supported

    def __init__(self, num_loops: int) -> None:
        self.num_loops = num_loops
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._call = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens cached so far."""
        return self.keys[0].shape[2] if self.keys else 0

    def begin_pass(self, num_loops: int) -> int:
        """Start a forward pass at ``num_loops``; returns the tokens already cached."""
        if num_loops != self.num_loops:
            raise ValueError(f"this cache holds {self.num_loops} loops; the pass asks for "
                             f"{num_loops} (start a new cache for another loop count)")
        self._call = 0
        return self.get_seq_length()

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's k, v [B, H, L, hd]; all keys and values of the call so far."""
        i, self._call = self._call, self._call + 1
        if i == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[i] = torch.cat([self.keys[i], k], dim=2)
            self.values[i] = torch.cat([self.values[i], v], dim=2)
        return self.keys[i], self.values[i]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep the rows ``beam_idx`` (beam search)."""
        self.keys = [k.index_select(0, beam_idx.to(k.device)) for k in self.keys]
        self.values = [v.index_select(0, beam_idx.to(v.device)) for v in self.values]


class Attention(nn.Module):
    """Multi-head or grouped-query self-attention with RoPE, fused q/k/v projection (rows:
    q heads, k heads, v heads), no biases."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.qkv = nn.Linear(dim, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor, cache: LoopKVCache | None = None) -> torch.Tensor:
        B, L, D = x.shape
        H, KV = self.n_heads, self.n_kv_heads
        q, k, v = self.qkv(x).view(B, L, H + 2 * KV, self.head_dim).split((H, KV, KV), dim=2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H or KV, L, hd]
        if cache is not None:  # the cached tokens' keys and values come first
            k, v = cache.update(k, v)
        # grouped-query (KV < H): SDPA reads kv head i // (H / KV) for query head i
        gqa = {"enable_gqa": True} if KV != H else {}
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **gqa)
        return self.out(y.transpose(1, 2).reshape(B, L, D))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MoEFFN(nn.Module):
    """Top-k routed SwiGLU experts; ``balance_bias`` shifts the selection only."""

    def __init__(self, dim: int, hidden: int, n_experts: int, top_k: int) -> None:
        super().__init__()
        self.n_experts, self.top_k = n_experts, top_k
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.w_gate = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w_up = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w_down = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.register_buffer("balance_bias", torch.zeros(n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        flat = x.reshape(B * L, D)
        probs = F.linear(flat.float(), self.router.weight.float()).softmax(dim=-1)  # [N, E]
        _, top_idx = torch.topk(probs + self.balance_bias, self.top_k, dim=-1)
        gates = probs.gather(-1, top_idx)  # [N, k]
        if self.top_k > 1:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        ids = top_idx.reshape(-1)  # [N·k]: slot s of token n at n·k + s
        ys = flat.new_zeros(ids.numel(), D)
        for e in range(self.n_experts):
            rows = (ids == e).nonzero().squeeze(1)
            if rows.numel():
                xs = flat[rows // self.top_k]
                h = F.silu(xs @ self.w_gate[e].to(xs.dtype)) * (xs @ self.w_up[e].to(xs.dtype))
                ys[rows] = h @ self.w_down[e].to(xs.dtype)
        y = (ys.view(-1, self.top_k, D) * gates[..., None].to(ys.dtype)).sum(dim=1)
        return y.view(B, L, D)


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: LooplineConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.attn_norm = RMSNorm(d, config.rms_norm_eps)
        self.attn = Attention(d, config.num_attention_heads, config.num_key_value_heads)
        self.ffn_norm = RMSNorm(d, config.rms_norm_eps)
        if config.moe_experts:
            self.ffn = MoEFFN(d, config.moe_intermediate_size, config.moe_experts,
                              config.moe_top_k)
        else:
            self.ffn = SwiGLU(d, config.intermediate_size)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor, cache: LoopKVCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, mask, cache)
        return x + self.ffn(self.ffn_norm(x))


class LooplinePreTrainedModel(PreTrainedModel):
    config_class = LooplineConfig
    base_model_prefix = "loopline"
    _no_split_modules = ["Block"]

    def _init_weights(self, module: nn.Module) -> None:
        """Normal(0, 0.02) weights for a fresh model (loaded weights are kept)."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, MoEFFN):
            for w in (module.w_gate, module.w_up, module.w_down):
                nn.init.normal_(w, std=0.02)
            nn.init.zeros_(module.balance_bias)
        elif isinstance(module, LooplineForCausalLM) and module.injection_scale is not None:
            nn.init.constant_(module.injection_scale, float(module.config.injection_scale))


def padding_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   position_ids: torch.Tensor | None, past: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [B, L], attention mask [B, 1, L, past + L] bool) of a causal, maybe padded
    batch whose first ``past`` tokens are cached (``attention_mask`` covers all of them).

    A query attends to earlier real tokens; a padding query to itself only (stays finite).
    """
    B, L = input_ids.shape
    T, dev = past + L, input_ids.device
    mask = torch.ones(L, T, dtype=torch.bool, device=dev).tril(past)[None].expand(B, L, T)
    if attention_mask is None:
        positions = torch.arange(past, T, device=dev).expand(B, L)
    else:
        real = attention_mask.to(dev).bool()[:, -T:]  # [B, T]
        positions = (real.long().cumsum(-1) - 1).clamp_min(0)[:, past:]
        itself = torch.eye(L, T, dtype=torch.bool, device=dev).roll(past, dims=1)
        mask = (mask & real[:, None, :]) | itself
    if position_ids is not None:
        positions = position_ids.to(dev)[:, -L:]
    return positions, mask[:, None]


class LooplineForCausalLM(LooplinePreTrainedModel, GenerationMixin):
    """Looped causal LM: ``forward(input_ids, num_loops=…)`` and ``generate(…, num_loops=…)``."""

    def __init__(self, config: LooplineConfig) -> None:
        super().__init__(config)
        d, v = config.hidden_size, config.vocab_size
        self.tok_emb = nn.Embedding(v, d)
        self.prelude = nn.ModuleList(Block(config) for _ in range(config.prelude_layers))
        self.core = nn.ModuleList(Block(config) for _ in range(config.core_layers))
        self.coda = nn.ModuleList(Block(config) for _ in range(config.coda_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.head = None if config.tie_embeddings else nn.Linear(d, v, bias=False)
        linear = config.injection == "linear"
        self.injection_proj = nn.Linear(2 * d, d, bias=False) if linear else None
        self.injection_scale = (None if linear else
                                nn.Parameter(torch.tensor(float(config.injection_scale))))
        rows = config.step_embedding_rows
        self.step_emb = nn.Embedding(rows, d) if rows else None
        self.exit_gate = nn.Linear(d, 1) if getattr(config, "exit_gate", False) else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.tok_emb

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.tok_emb = value

    def get_output_embeddings(self) -> nn.Module | None:
        return self.head

    def _loop(self, state: torch.Tensor, e: torch.Tensor, t: int, rope, mask,
              cache: LoopKVCache | None) -> torch.Tensor:
        if self.injection_proj is not None:
            x = self.injection_proj(torch.cat([state, e], dim=-1))
        else:
            x = state + self.injection_scale.to(state.dtype) * e
        if self.step_emb is not None:  # loops past the table reuse its last row
            x = x + self.step_emb.weight[min(t, self.step_emb.num_embeddings - 1)]
        for block in self.core:
            x = block(x, rope, mask, cache)
        return x

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None,
                labels: torch.LongTensor | None = None, num_loops: int | None = None,
                cache: LoopKVCache | None = None, use_cache: bool | None = None,
                **kwargs) -> CausalLMOutputWithPast:
        """Logits [B, L, V] after ``num_loops`` core loops (default ``config.num_loops``);
        with ``labels`` also the mean next-token loss (labels shifted inside, -100 ignored).

        ``cache``: a :class:`LoopKVCache` holding the tokens before ``input_ids`` (whose
        ``attention_mask`` then covers the cached tokens too); ``use_cache=True`` starts one
        when none is given. The output's ``cache`` is the cache after this pass."""
        loops = int(self.config.num_loops if num_loops is None else num_loops)
        if loops < 1:
            raise ValueError(f"num_loops must be at least 1, got {num_loops}")
        if cache is None and use_cache:
            cache = LoopKVCache(loops)
        past = 0 if cache is None else cache.begin_pass(loops)
        positions, mask = padding_inputs(input_ids, attention_mask, position_ids, past)
        cfg = self.config
        rope = rope_tables(positions, cfg)
        e = self.tok_emb(input_ids)  # [B, L, D]
        for block in self.prelude:
            e = block(e, rope, mask, cache)
        state = torch.zeros_like(e) if cfg.state_init == "zeros" else e
        for t in range(loops):
            state = self._loop(state, e, t, rope, mask, cache)
        for block in self.coda:
            state = block(state, rope, mask, cache)
        head = self.tok_emb.weight if self.head is None else self.head.weight
        logits = F.linear(self.norm(state), head)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                   labels[:, 1:].flatten().to(logits.device), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor,
                                      attention_mask: torch.Tensor | None = None,
                                      num_loops: int | None = None,
                                      cache: LoopKVCache | None = None,
                                      use_cache: bool | None = None, **kwargs) -> dict:
        """The tokens not yet cached (all of them without a cache), the whole mask, the loop
        count and the cache (``use_cache`` starts one on the first step)."""
        if cache is not None:
            input_ids = input_ids[:, cache.get_seq_length():]
        return {"input_ids": input_ids, "attention_mask": attention_mask, "num_loops": num_loops,
                "cache": cache, "use_cache": use_cache}

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model keeps its own cache (LoopKVCache), not transformers' layers
