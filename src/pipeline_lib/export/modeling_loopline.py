"""A loopline looped transformer as a 🤗 transformers model (remote code: torch + transformers).

``python -m pipeline_lib export`` copies this file, ``loopline_layers.py`` (its building
blocks) and ``loopline_adaptive.py`` (adaptive depth under the exit gate), both imported
relatively, unchanged, next to ``config.json`` and ``model.safetensors``, so that::

    model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
    model(input_ids, num_loops=8).logits          # read out after 8 core loops
    model.generate(input_ids, num_loops=8, max_new_tokens=20)
    out = model(input_ids, num_loops=8, exit_threshold=0.9)   # learned exit gate
    out.logits, out.exit_loops                    # each position at its own exit loop
    gen = model.generate(input_ids, num_loops=8, exit_threshold=0.9, max_new_tokens=20,
                         return_dict_in_generate=True)        # tokens stop at their exit
    gen.cache.exit_loops[:, input_ids.shape[1] - 1:]          # loops of each new token

works without loopline installed. The three files import nothing but torch and transformers.

The model: embedding → prelude blocks → core blocks applied ``num_loops`` times with input
injection (state ← core(state + λ·e), or core(W[state; e])) → coda blocks → final RMSNorm →
head. Gated recurrence (``loop_gate_rows`` > 0): loop 1 as above, every later loop t adds
its gated core increment, state ← state + g_t·(core(x) − x) with x the injected state (loops
past the gates reuse the last). ``state_init`` ``noise`` draws the initial state from a
normal of std ``state_noise_std`` cut at ±3 std in training mode; in eval mode it is zeros.
``config.num_loops`` is the training loop count and the default; any count ≥ 1 may be passed
to ``forward`` and ``generate``. Module names equal loopline's ``LoopedLM``, so the
weights are its state dict as is. Logits equal ``LoopedLM.logits_at`` (fp32, tested).

Learned exit gate (``exit_gate: true`` in config.json; Ouro-style, one ``nn.Linear(d, 1)``
shared by every loop): after loop t, λ_t = sigmoid(exit_gate(h_t)) with h_t = norm(coda(
state_t)) the readout hidden state, and the cumulative exit probability is
1 − ∏_{s≤t} (1 − λ_s). With ``exit_threshold=T`` (a probability in [0, 1]) a position is
read out at the first loop t < ``num_loops`` whose cumulative exit probability exceeds T
(strictly), else at ``num_loops``, its exit loop in the output's ``exit_loops`` [B, L]:

- ``forward`` without a cache, and ``generate(use_cache=False)`` at every step: every
  position runs all ``num_loops`` loops and the coda after each (later positions attend to
  its state at every loop), so the gate picks the readout and saves nothing: the semantics
  and the logits of loopline's ``adaptive_logits(model, ids, T, num_loops, "gate")`` (fp32,
  tested).
- ``generate`` with its cache (``use_cache``, the default): the prompt runs as above (every
  loop's keys and values kept), then each new token stops looping at its gate exit, and its
  later loops, core blocks and the coda readouts after them, are never computed: loopline's
  cached adaptive decoding (``generate --adaptive gate:T:MAX``; the same tokens, loops per
  token and logits within 1e-5 in fp32, tested). A later token at loop t attending to a
  position that stopped at loop e < t reads what ``kv_fill`` (an argument of ``generate``
  and ``forward``) says: ``"latest"`` (default), that position's keys and values of loop e
  (copied into the later loops' slots when it stops: no compute); ``"skip"``, nothing (the
  position is masked at the loops it did not reach). Every coda call reads each earlier
  position's coda keys and values of its exit loop (the prompt's: of its last loop). The
  tokens may differ from ``use_cache=False``'s: the computations differ.
- The loops each generated token took: ``generate(…, return_dict_in_generate=True)`` returns
  the cache (:class:`AdaptiveKVCache`), whose ``exit_loops`` [B, T] holds the exit loop of
  every cached position; position j's is the depth that predicted token j + 1, so the new
  tokens' are ``gen.cache.exit_loops[:, P - 1:]`` for a prompt of width P (a row that
  ended keeps decoding padding: cut it at its EOS). ``gen.cache.reached`` [B, T]: the loops
  computed at each position (``num_loops`` for the prompt).

T = 1 never exits early and runs the fixed-depth path (``exit_loops`` all ``num_loops``);
without a threshold ``exit_loops`` is None. ``config.exit_threshold`` (null in an export:
fixed depth) is the default of both ``forward`` and ``generate``, e.g.
``from_pretrained(DIR, …, exit_threshold=0.9)``. A threshold outside [0, 1], or on a model
without the gate, and a ``kv_fill`` other than ``"latest"`` or ``"skip"`` are refused
(ValueError).

Grouped-query attention (``num_key_value_heads`` < ``num_attention_heads``, as Llama's):
query head i reads key/value head i // (heads / kv heads); the fused ``qkv`` projection holds
all q heads, then all k heads, then all v heads. RoPE frequencies may be scaled as
transformers' ``linear`` and ``llama3`` rope types do (``rope_scaling_type`` and the
``rope_*`` keys of config.json). Exports written before these keys existed load as plain
multi-head attention with unscaled RoPE.

Models imported from other families keep their options (config.json keys, absent in older
exports, which load as before): ``head_dim`` (heads of another width than hidden / heads),
``qkv_bias`` (Qwen2's q/k/v biases), ``qk_norm`` (RMSNorm of queries and keys before RoPE:
``head``, per head as Qwen3; ``all_heads``, over all heads as OLMo-2) and ``norm_placement``
(``pre``: x + f(norm(x)); ``post``: x + norm(f(x)), OLMo-2's).

``attention_mask`` marks padding (left or right): padded keys are never attended to and
positions count real tokens only, so a padded row gives the logits of the unpadded one.

``generate`` keeps a KV cache (``use_cache``, on by default) so each step runs only the new
token: :class:`LoopKVCache` at fixed depth (the keys and values of every attention call —
prelude blocks, each core block once per loop, since every loop sees a different state,
coda blocks once), :class:`AdaptiveKVCache` under a threshold (the same slots, and what
each position reached; see above). A cache is bound to the loop count, the mode (fixed or
gated) and the ``kv_fill`` it was filled with. Greedy, sampling and beam search (the cache
reorders) work with it; assisted decoding does not; ``use_cache=False`` recomputes the
window every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .loopline_adaptive import (
    AdaptiveKVCache,
    adaptive_step,
    check_kv_fill,
    full_depth_readout,
)
from .loopline_layers import (
    Block,
    LoopKVCache,
    MoEFFN,
    RMSNorm,
    padding_inputs,
    rope_tables,
)


class LooplineConfig(PretrainedConfig):
    """Shape of a loopline model; ``num_loops`` is the default core loop count and
    ``exit_threshold`` the default exit threshold of a gated model (None: fixed depth)."""

    model_type = "loopline"

    def __init__(self, vocab_size: int = 258, hidden_size: int = 128,
                 num_attention_heads: int = 4, prelude_layers: int = 1, core_layers: int = 1,
                 coda_layers: int = 1, num_loops: int = 4, intermediate_size: int = 352,
                 moe_experts: int = 0, moe_top_k: int = 2, moe_intermediate_size: int = 0,
                 injection: str = "add", injection_scale: float = 1.0,
                 step_embedding_rows: int = 0, state_init: str = "zeros",
                 learned_positions: int = 0,
                 loop_gate_rows: int = 0, state_noise_std: float = 0.02,
                 tie_embeddings: bool = True, rope_theta: float = 10000.0,
                 rms_norm_eps: float = 1e-6, max_position_embeddings: int = 256,
                 num_key_value_heads: int | None = None, rope_scaling_type: str = "none",
                 rope_scaling_factor: float = 1.0, rope_low_freq_factor: float = 1.0,
                 rope_high_freq_factor: float = 4.0, rope_original_max_position: int = 8192,
                 exit_gate: bool = False, exit_threshold: float | None = None,
                 head_dim: int | None = None, qkv_bias: bool = False, qk_norm: str = "none",
                 norm_placement: str = "pre", **kwargs) -> None:
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        # options of imported families (Qwen2, Qwen3, OLMo-2): see loopline_layers.Attention
        self.qkv_bias, self.qk_norm, self.norm_placement = qkv_bias, qk_norm, norm_placement
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
        self.learned_positions = learned_positions  # rows of the absolute position table
        self.loop_gate_rows, self.state_noise_std = loop_gate_rows, state_noise_std
        self.tie_embeddings, self.rope_theta = tie_embeddings, rope_theta
        self.rms_norm_eps, self.max_position_embeddings = rms_norm_eps, max_position_embeddings
        self.exit_gate, self.exit_threshold = exit_gate, exit_threshold
        # The model reads the tied head from tok_emb itself; transformers must not tie.
        kwargs["tie_word_embeddings"] = False
        super().__init__(**kwargs)




@dataclass
class LooplineCausalLMOutput(CausalLMOutputWithPast):
    """``CausalLMOutputWithPast`` plus ``exit_loops`` [B, L] (int64): the loop each position
    was read out at under an exit threshold (None without one)."""

    exit_loops: torch.LongTensor | None = None


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
        elif isinstance(module, LooplineForCausalLM):
            if module.injection_scale is not None:
                nn.init.constant_(module.injection_scale, float(module.config.injection_scale))
            if module.loop_gate is not None:  # loops after the first start as no-ops
                nn.init.zeros_(module.loop_gate)



class LooplineForCausalLM(LooplinePreTrainedModel, GenerationMixin):
    """Looped causal LM: ``forward(input_ids, num_loops=…, exit_threshold=…)`` and
    ``generate(…, num_loops=…, exit_threshold=…)`` (see the module docstring)."""

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
        positions = getattr(config, "learned_positions", 0)  # older exports have none
        self.pos_emb = nn.Embedding(positions, d) if positions else None
        gates = getattr(config, "loop_gate_rows", 0)
        self.loop_gate = nn.Parameter(torch.zeros(gates)) if gates else None
        self.exit_gate = nn.Linear(d, 1) if getattr(config, "exit_gate", False) else None
        self.post_init()
        self._exit_threshold(None)  # a config.json default that cannot apply fails at load

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
        out = x
        for block in self.core:
            out = block(out, rope, mask, cache)
        if self.loop_gate is None or t == 0:
            return out
        g = self.loop_gate[min(t - 1, self.loop_gate.numel() - 1)]
        return state + g.to(state.dtype) * (out - x)

    def _initial_state(self, e: torch.Tensor) -> torch.Tensor:
        """The state before loop 1: zeros, the prelude output, or (``noise``, training mode
        only) a truncated normal."""
        if self.config.state_init == "embedding":
            return e
        if self.config.state_init == "noise" and self.training:
            std = float(getattr(self.config, "state_noise_std", 0.02))
            noise = torch.empty(e.shape, dtype=torch.float32, device=e.device)
            return nn.init.trunc_normal_(noise, std=std, a=-3 * std, b=3 * std).to(e.dtype)
        return torch.zeros_like(e)

    def _readout(self, state: torch.Tensor, rope, mask, cache: LoopKVCache | None
                 ) -> torch.Tensor:
        """norm(coda(state)) [B, L, D]: what the head reads."""
        for block in self.coda:
            state = block(state, rope, mask, cache)
        return self.norm(state)

    def _exit_threshold(self, exit_threshold: float | None) -> float | None:
        """The pass's threshold: ``exit_threshold``, else ``config.exit_threshold``; None is
        fixed depth. Refuses one outside [0, 1] or on a model without the exit gate."""
        key, value = "exit_threshold", exit_threshold
        if value is None:
            key, value = ("config.exit_threshold (config.json)",
                          getattr(self.config, "exit_threshold", None))
        if value is None:
            return None
        if self.exit_gate is None:
            raise ValueError(f"{key}={value!r} needs the learned exit gate, which this model "
                             "lacks (config.json exit_gate: false); leave exit_threshold unset "
                             "for fixed depth")
        try:
            threshold = float(value)
        except (TypeError, ValueError):
            threshold = float("nan")
        if not 0 <= threshold <= 1:  # also nan
            raise ValueError(f"{key}={value!r} must be a cumulative exit probability in [0, 1] "
                             "(1 = never exit early), e.g. 0.9")
        return threshold

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None,
                labels: torch.LongTensor | None = None, num_loops: int | None = None,
                exit_threshold: float | None = None, cache: LoopKVCache | None = None,
                use_cache: bool | None = None, kv_fill: str = "latest",
                **kwargs) -> LooplineCausalLMOutput:
        """Logits [B, L, V] after ``num_loops`` core loops (default ``config.num_loops``);
        with ``labels`` also the mean next-token loss (labels shifted inside, -100 ignored).

        ``exit_threshold`` (default ``config.exit_threshold``; needs the exit gate): each
        position read out at its gate exit loop, at most ``num_loops``; ``exit_loops`` [B, L]
        says which. ``cache``: a :class:`LoopKVCache` (:class:`AdaptiveKVCache` under a
        threshold) holding the tokens before ``input_ids`` (whose ``attention_mask`` then
        covers the cached tokens too); ``use_cache=True`` starts one when none is given. Under
        a threshold, one token per row over a filled cache stops at its exit loop and
        ``kv_fill`` (``latest`` or ``skip``) says what later tokens read of it (module doc).
        The output's ``cache`` is the cache after this pass."""
        loops = int(self.config.num_loops if num_loops is None else num_loops)
        if loops < 1:
            raise ValueError(f"num_loops must be at least 1, got {num_loops}")
        threshold, kv_fill = self._exit_threshold(exit_threshold), check_kv_fill(kv_fill)
        gated = threshold is not None and threshold < 1  # T = 1 never exits: fixed depth
        if cache is None and use_cache:
            cache = AdaptiveKVCache(loops, self.config, kv_fill) if gated else LoopKVCache(loops)
        past = 0 if cache is None else cache.begin_pass(loops, gated, kv_fill if gated else None)
        positions, mask = padding_inputs(input_ids, attention_mask, position_ids, past)
        if gated and cache is not None:
            cache.add_columns(*input_ids.shape, input_ids.device)
        rope = rope_tables(positions, self.config)
        e = self.tok_emb(input_ids)  # [B, L, D]
        if self.pos_emb is not None:  # absolute positions, re-injected with e at every loop
            e = e + self.pos_emb(positions)
        for block in self.prelude:
            e = block(e, rope, mask, cache)
        state = self._initial_state(e)
        if gated:
            pass_ = adaptive_step if cache is not None and cache.decoding else full_depth_readout
            hidden, exit_loops = pass_(self, state, e, loops, threshold, rope, mask, cache)
        else:
            for t in range(loops):
                state = self._loop(state, e, t, rope, mask, cache)
            hidden = self._readout(state, rope, mask, cache)
            exit_loops = None if threshold is None else torch.full(
                input_ids.shape, loops, dtype=torch.long, device=hidden.device)
        head = self.tok_emb.weight if self.head is None else self.head.weight
        logits = F.linear(hidden, head)
        loss = None
        if labels is not None:  # -100: loopline's IGNORE_INDEX (spec/names.py), spelt out
            # because this file ships beside exported weights and imports no loopline code
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                   labels[:, 1:].flatten().to(logits.device), ignore_index=-100)
        return LooplineCausalLMOutput(loss=loss, logits=logits, cache=cache,
                                      exit_loops=exit_loops)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor,
                                      attention_mask: torch.Tensor | None = None,
                                      num_loops: int | None = None,
                                      exit_threshold: float | None = None,
                                      cache: LoopKVCache | None = None,
                                      use_cache: bool | None = None, kv_fill: str = "latest",
                                      **kwargs) -> dict:
        """The tokens not yet cached (all of them without a cache), the whole mask, the loop
        count, the exit threshold, ``kv_fill`` and the cache (``use_cache`` starts one on the
        first step)."""
        if cache is not None:
            input_ids = input_ids[:, cache.get_seq_length():]
        return {"input_ids": input_ids, "attention_mask": attention_mask, "num_loops": num_loops,
                "exit_threshold": exit_threshold, "cache": cache, "use_cache": use_cache,
                "kv_fill": kv_fill}

    def adjust_generation_fn(self, *args, **kwargs) -> None:
        """Load the generation config, without ``num_loops`` or ``exit_threshold``:
        transformers hands ``from_pretrained``'s keyword arguments to it too, and there they
        would swallow those of ``generate()`` (the model config keeps them as defaults)."""
        super().adjust_generation_fn(*args, **kwargs)
        for key in ("num_loops", "exit_threshold"):
            if key in self.generation_config.__dict__:
                delattr(self.generation_config, key)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model keeps its own cache (LoopKVCache), not transformers' layers
