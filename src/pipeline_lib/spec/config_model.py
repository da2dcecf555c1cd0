"""The model section of the config: the looped architecture and its pretrained start."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import config_field as _f


@dataclass
class InitFromConfig:
    """Start from a pretrained Hugging Face model (``import-hf``: Llama, Mistral, Qwen2, Qwen3,
    OLMo-2): its chosen
    layers become prelude, core and coda; the architecture keys of ``model`` come from it."""

    source: str = _f("", "Hugging Face model directory (config.json + *.safetensors) or a "
                     ".gguf file; empty = random init.")
    prelude: list[int] = _f([], "Source layers of the prelude as [start, end] (half-open); "
                            "[] = none (or, with core and coda empty too, the whole model as "
                            "the core).")
    core: list[int] = _f([], "Source layers of the looped core as [start, end] (half-open); "
                         "[] with prelude and coda empty = every layer.")
    coda: list[int] = _f([], "Source layers of the coda as [start, end] (half-open); [] = none.")
    adapter: str = _f("add", "Input injection of the retrofitted loop: add (state + λ·e) or "
                      "linear (W[state; e], W = [I | λI] at the start); sets model.injection.",
                      choices=["add", "linear"])


@dataclass
class ModelConfig:
    """Looped transformer: prelude → core × loops (input injection) → coda → norm → head."""

    vocab_size: int = _f(0, "Vocabulary size; 0 = the tokenizer's (byte, file: filled in when the run is planned; a trained BPE: its pack's metadata.json).", minimum=0)
    d_model: int = _f(128, "Residual stream width.", minimum=8)
    n_heads: int = _f(4, "Attention heads; must divide d_model (unless head_dim is set).",
                      minimum=1)
    n_kv_heads: int = _f(0, "Key/value heads (grouped-query attention); 0 = n_heads; must "
                         "divide n_heads.", minimum=0)
    head_dim: int = _f(0, "Width of one attention head; 0 = d_model / n_heads (set by "
                       "import-hf for models such as Qwen3 whose heads are wider or narrower).",
                       minimum=0)
    qkv_bias: bool = _f(False, "Biases on the query, key and value projections (Qwen2's; set "
                        "by import-hf).")
    qk_norm: str = _f("none", "RMSNorm of queries and keys before RoPE: none, head (per head "
                      "over head_dim, one gain shared by the heads: Qwen3) or all_heads (over "
                      "all query heads and over all key heads: OLMo-2); set by import-hf.",
                      choices=["none", "head", "all_heads"])
    norm_placement: str = _f("pre", "Where a block's two RMSNorms sit: pre (x + f(norm(x)), "
                             "Llama's) or post (x + norm(f(x)), OLMo-2's); set by import-hf.",
                             choices=["pre", "post"])
    prelude_layers: int = _f(1, "Blocks before the loop (run once).", minimum=0)
    core_layers: int = _f(1, "Blocks in the looped core.", minimum=1)
    coda_layers: int = _f(1, "Blocks after the loop (run once per readout).", minimum=0)
    loops: int = _f(4, "Core applications in training (fixed sampling) and the default readout.",
                    minimum=1)
    ffn_hidden: int = _f(0, "SwiGLU hidden width; 0 = 8/3·d_model rounded up to a multiple of 16.",
                         minimum=0)
    moe_experts: int = _f(0, "Experts per MoE FFN; 0 = dense SwiGLU.", minimum=0)
    moe_top_k: int = _f(2, "Experts chosen per token.", minimum=1)
    moe_ffn_hidden: int = _f(0, "Hidden width per expert (0 = ffn_hidden / top_k), rounded "
                             "up to a multiple of 8 (grouped GEMM needs 16-byte rows).", minimum=0)
    moe_aux_loss_weight: float = _f(0.01, "Weight of the Switch load-balancing loss (0 = off).", minimum=0)
    moe_bias_update_rate: float = _f(
        0.001, "γ of aux-loss-free balancing: bias += γ·(1/E − load) after each step (0 = off).",
        minimum=0)
    injection: str = _f("add", "Input injection: add (core(state + λ·e)) or linear (core(W[state; e])).",
                        choices=["add", "linear"])
    injection_scale: float = _f(1.0, "λ of additive injection (initial value when learnable).")
    learn_injection_scale: bool = _f(False, "Make λ a learnable scalar with its own parameter group.")
    step_embedding: bool = _f(False, "Add a learned per-loop step embedding to the state.")
    init: str = _f("scaled", "Weight init: scaled (normal(0, init_std), residual output "
                   "projections std/sqrt(2·depth), linear injection starting as the additive map: "
                   "GPT-2's, for language models) or fan_in (every weight matrix uniform in "
                   "±1/sqrt(fan_in), PyTorch's default, no depth scaling; embeddings normal(0, "
                   "init_std): small looped blocks on algorithmic tasks, docs/model.md).",
                   choices=["scaled", "fan_in"])
    learned_positions: int = _f(
        0, "Rows of a learned absolute position embedding added to the token embedding (so the "
        "input injected at every loop carries each token's position), on top of RoPE; 0 = "
        "none. Set it to data.seq_len; a position past it is an error. Looped models on "
        "algorithmic tasks need it to extrapolate in depth (docs/model.md).", minimum=0)
    state_init: str = _f("zeros", "Initial loop state: zeros, the prelude output (embedding) or "
                         "noise (training: truncated normal, std init_std, cut at ±3 std; "
                         "outside training its mean, zeros).",
                         choices=["zeros", "embedding", "noise"])
    recurrence: str = _f("plain", "Loop update: plain (state ← core(x), x = the injected state) "
                         "or gated (loop 1 as plain; loop t ≥ 2 adds its core increment "
                         "g_t·(core(x) − x), g_t learned and 0 at the start: extra loops begin "
                         "as exact no-ops).", choices=["plain", "gated"])
    tie_embeddings: bool = _f(True, "Share the token embedding with the output head.")
    rope_theta: float = _f(10000.0, "RoPE base frequency.", exclusive_minimum=0)
    rope_scaling: str = _f("none", "RoPE frequency scaling: none, linear (every frequency / "
                           "rope_scaling_factor) or llama3 (Llama 3.1's: low frequencies / "
                           "factor, high ones kept, smooth in between).",
                           choices=["none", "linear", "llama3"])
    rope_scaling_factor: float = _f(1.0, "linear and llama3: the factor frequencies are divided "
                                    "by (context extension ratio).", exclusive_minimum=0)
    rope_low_freq_factor: float = _f(1.0, "llama3: wavelengths over rope_original_max_position / "
                                     "this are divided by the factor.", exclusive_minimum=0)
    rope_high_freq_factor: float = _f(4.0, "llama3: wavelengths under rope_original_max_position "
                                      "/ this are kept; must exceed rope_low_freq_factor.",
                                      exclusive_minimum=0)
    rope_original_max_position: int = _f(8192, "llama3: context length (tokens) of the original "
                                         "pretraining.", minimum=1)
    norm_eps: float = _f(1e-6, "RMSNorm epsilon.", exclusive_minimum=0)
    init_std: float = _f(0.02, "Standard deviation of the normal weight init.", exclusive_minimum=0)
    loss_chunk_size: int = _f(1024, "Tokens per chunk of the chunked cross-entropy.", minimum=1)
    attention: str = _f("auto", "Attention kernel: auto (flex on CUDA, else sdpa), sdpa or flex.",
                        choices=["auto", "sdpa", "flex"])
    exit_gate: bool = _f(False, "Learned exit gate: one Linear(d_model, 1) shared by every loop "
                         "maps the normed readout state to an exit logit (train it with "
                         "train.objective = expected_exit; eval criterion gate).")
    init_from: InitFromConfig = _f(InitFromConfig(), "Pretrained start (empty source = random "
                                   "init); the source fixes vocab_size, d_model, n_heads, "
                                   "n_kv_heads, head_dim, qkv_bias, qk_norm, norm_placement, "
                                   "ffn_hidden, norm_eps, rope_*, tie_embeddings and the layer "
                                   "counts.")

