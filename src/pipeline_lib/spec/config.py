"""Configuration: one dataclass per section, OmegaConf only at the edges.

Resolution order (later wins): dataclass defaults ← ``config/config.yaml`` (the embedded
default) ← a user config file (may be partial) ← ``key=value`` overrides. A named variant
from ``runs:`` is applied last by :func:`config_for_run`.

Every field is declared with :func:`~pipeline_lib.spec.fields.config_field` (``_f``) and
carries a ``help`` text (its unit, its meaning) and its bounds; the JSON schema in
``workflow/schemas/config.schema.yaml`` is generated from these dataclasses
(:mod:`pipeline_lib.spec.schema`), so schema and dataclasses cannot drift apart.

This module must stay light: the Snakefile imports it on every call (no torch, no mlflow).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..credentials import redact_config, redact_text
from ..errors import ConfigError
from .config_errors import explain_omegaconf_error, mistyped_section
from .config_files import (
    apply_data_defaults,
    config_paths,
    data_defaults,
    omegaconf,
    read_yaml,
    set_keys,
    upgrade_legacy_keys,
)
from .config_files import merge_config_dicts as merge_config_dicts  # the merge rules, as data
from .config_files import merge_config_files as merge_config_files
from .fields import check_field_constraints
from .fields import config_field as _f
from .names import LABELLED_TASKS, REASONING_TASKS, is_name
from .rules import (
    EXIT_CRITERIA,
    FREEZE_PARTS,
    MAX_TEST_LOOPS,
    check_activation_checkpointing,
    check_adaptive_exit,
    check_bench_sampling,
    check_distill,
    check_exit_objective,
    check_labelled_sources,
    check_learned_positions,
    check_optimizer_and_freeze,
    check_source_fields,
    check_tokenizer,
    check_val_fraction,
    sources_have_answers,
    sources_have_levels,
)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CONFIG_PATH = PROJECT_ROOT / "config" / "config.yaml"
RUN_NAME_PATTERN = r"^(?!data$|compare$)[A-Za-z_][A-Za-z0-9_]*$"
OBJECTIVES = ["last", "deep_supervision", "answer_last", "answer_deep_supervision",
              "expected_exit"]


# --------------------------------------------------------------------------- sections


@dataclass
class ExperimentConfig:
    """Identity of the experiment and where its results go."""

    name: str = _f("loopline-default", "MLflow experiment name; one experiment per config file.")
    seed: int = _f(1234, "Master seed for model initialisation, loop sampling and training RNG.", minimum=0)
    results_dir: str = _f("results", "Directory of the run tree (data packs, runs, compare, mlflow.db).")
    device: str = _f(
        "auto",
        "Compute device: auto picks cuda, then npu, then cpu.",
        choices=["auto", "cpu", "cuda", "npu"],
    )
    precision: str = _f(
        "auto",
        "Compute precision on experiment.device: auto (bf16 where the device has it natively, "
        "else fp32; fp32 on the CPU), bf16 (autocast, or the FSDP policy; fp32 master weights, "
        "loss and snapshots) or fp32.",
        choices=["auto", "bf16", "fp32"],
    )


@dataclass
class TrackingConfig:
    """MLflow tracking; the MLFLOW_TRACKING_URI environment variable overrides ``uri``."""

    enabled: bool = _f(True, "Log params, metrics and artifacts to MLflow.")
    uri: str = _f(
        "sqlite:///results/mlflow.db",
        "Tracking store URI: sqlite:///path for a local store, http://host:port for a server.",
    )
    system_metrics: bool = _f(False, "Also log CPU/memory/GPU usage through MLflow system metrics.")


@dataclass
class SourceConfig:
    """One corpus source. ``path``: a glob (parquet, jsonl, text, labelled); built-ins need none."""

    type: str = _f(
        "stdlib",
        "Source kind: parquet, jsonl, text (one document per file), stdlib (Python's standard "
        "library sources), reasoning (seeded procedural multi-step problems) or labelled "
        "(sequence labelling: a label per input token, scored at that token; records from the "
        "JSONL files of path, or the built-in tasks without one). A pack is labelled or not: "
        "labelled sources do not mix with others.",
        choices=["parquet", "jsonl", "text", "stdlib", "reasoning", "labelled"],
    )
    path: str = _f("", "Glob of input files (parquet, jsonl, text, labelled JSONL); empty for "
                   "built-ins (labelled: the built-in tasks).")
    text_field: str = _f("text", "Column (parquet) or key (jsonl) holding the document text.")
    prompt_field: str = _f(
        "", "jsonl/parquet: column or key of the prompt; with answer_field the document is "
        "prompt + answer and the answer span is recorded (text_field is then unused). "
        "Empty = off.")
    answer_field: str = _f("", "jsonl/parquet: column or key of the answer (set with "
                           "prompt_field; an empty answer is an error). Empty = off.")
    level_field: str = _f("", "jsonl/parquet: integer column or key (>= 0) with each document's "
                          "level (difficulty), kept in the pack. Empty = none.")
    weight: float = _f(
        1.0,
        "Repeat factor: each document appears floor(weight) times plus once more with "
        "probability frac(weight) (seeded).",
        exclusive_minimum=0,
    )
    max_docs: int = _f(0, "Read at most this many documents from the source (0 = all).", minimum=0)
    heldout: bool = _f(False, "Every document of this source goes to the held-out (validation) "
                       "split: scored by validation and the H_eff sweep, never trained on (test "
                       "sets, levels beyond the training range).")
    num_docs: int = _f(2000, "reasoning, built-in labelled tasks: number of documents to "
                       "generate.", minimum=1)
    tasks: list[str] = _f(
        list(REASONING_TASKS),
        "Generators to draw from: reasoning: khop, addition, parity; labelled without a path: "
        "prefix_parity, chain_root.",
        items={"choices": [*REASONING_TASKS, *LABELLED_TASKS]},
    )
    min_difficulty: int = _f(1, "reasoning, built-in labelled tasks: smallest difficulty k "
                             "(hops, digits, bits; labelled: the level).", minimum=1)
    max_difficulty: int = _f(4, "reasoning, built-in labelled tasks: largest difficulty k used "
                             "(drawn uniformly per document).", minimum=1)
    seed: int = _f(0, "reasoning, built-in labelled tasks: generator seed (benchmarks use "
                   "disjoint seeds).", minimum=0)


@dataclass
class TokenizerConfig:
    """Tokenizer trained or built at pack time and saved as tokenizer.json."""

    type: str = _f("byte", "byte: byte-level, 256 symbols + specials; bpe: BPE trained on the "
                   "corpus; file: a pretrained model's tokenizer, read from path (its vocabulary "
                   "unchanged).", choices=["byte", "bpe", "file"])
    vocab_size: int = _f(1024, "bpe: target vocabulary size including special tokens.", minimum=260)
    min_frequency: int = _f(2, "bpe: minimum pair frequency for a merge.", minimum=1)
    path: str = _f("", "file: a tokenizer.json, a Hugging Face tokenizer or model directory (its "
                   "tokenizer.json, plus tokenizer_config.json / special_tokens_map.json / "
                   "config.json for BOS, EOS and add_bos_token) or a .gguf model file (the "
                   "tokenizer in its metadata); relative to the working directory. Empty for "
                   "byte and bpe.")
    add_bos: str = _f("auto", "file: start every document with the tokenizer's BOS token: auto "
                      "(when the source asks for it: add_bos_token in tokenizer_config.json or "
                      "the GGUF, else a post-processor that prepends one), true or false. "
                      "byte and bpe tokenizers have no BOS.", choices=["auto", "true", "false"])

    def __post_init__(self) -> None:
        # YAML's true/false reach a str field as "True"/"False" (and Python callers pass bools)
        if isinstance(self.add_bos, bool) or self.add_bos in ("True", "False"):
            self.add_bos = str(self.add_bos).lower()


@dataclass
class DataConfig:
    """Corpus, tokenizer and packing into rows of seq_len + 1 tokens."""

    sources: list[SourceConfig] = _f(
        [SourceConfig(type="stdlib", max_docs=400), SourceConfig(type="reasoning")],
        "Corpus sources, concatenated in order before the train/validation split.",
    )
    tokenizer: TokenizerConfig = _f(TokenizerConfig(), "Tokenizer settings.")
    seq_len: int = _f(128, "Tokens per training row (inputs); rows hold seq_len + 1 tokens.", minimum=2)
    epochs: int = _f(2, "Epoch permutations packed; the data stream cycles past the last one.", minimum=1)
    val_fraction: float = _f(0.02, "Fraction of whole documents held out for validation "
                             "(> 0: training and the H_eff sweep read validation rows), of "
                             "those not in a heldout source; 0 only with a heldout source.",
                             minimum=0, maximum=0.5)
    seed: int = _f(0, "Seed of the validation split and the per-epoch row order.", minimum=0)
    curriculum_fraction: float = _f(
        0.0, "Difficulty curriculum: over this fraction of epoch 0's rows the largest document "
        "level allowed rises linearly from the smallest level to the largest (rows are then "
        "packed level by level in every epoch); 0 = off.", minimum=0, maximum=1)
    token_dtype: str = _f("auto", "Element type of tokens.bin: auto (uint16 when the vocabulary "
                          "fits in 65536 ids, else uint32), uint16 or uint32.",
                          choices=["auto", "uint16", "uint32"])


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

    vocab_size: int = _f(0, "Vocabulary size; 0 = taken from the packed data's tokenizer.", minimum=0)
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


@dataclass
class LoopSamplingConfig:
    """How many loops each training step runs (seeded by (seed, step): resume-exact)."""

    mode: str = _f("fixed", "fixed (model.loops), uniform [min_loops, max_loops] or poisson_lognormal.",
                   choices=["fixed", "uniform", "poisson_lognormal"])
    min_loops: int = _f(1, "Smallest loop count drawn.", minimum=1)
    max_loops: int = _f(8, "Largest loop count drawn.", minimum=1)
    mean: float = _f(4.0, "poisson_lognormal: mean loop count.", exclusive_minimum=0)
    sigma: float = _f(0.5, "poisson_lognormal: log-normal sigma of the Poisson rate.", minimum=0)
    ramp_steps: int = _f(
        0, "Loop-count curriculum: over this many steps the target (model.loops for fixed, "
        "max_loops for uniform, mean for poisson_lognormal) ramps linearly up from min_loops; "
        "0 = off.", minimum=0)


@dataclass
class BpttConfig:
    """Backpropagation through loops."""

    mode: str = _f("full", "full, truncated (last k loops carry gradients), progressive (the "
                   "last g loops carry gradients, g drawn per step from 1..min(loops, k), seeded "
                   "by (seed, step): with sampled loop counts, Bansal et al. 2022's progressive "
                   "loss) or unrolled (every k loops: loss, backward, optimizer step, detach).",
                   choices=["full", "truncated", "progressive", "unrolled"])
    k: int = _f(2, "Loops with gradients (truncated), their most (progressive) or loops per "
                "unroll (unrolled).", minimum=1)


@dataclass
class DistillConfig:
    """Healing by distillation: KL to a teacher's next-token distribution on the same rows."""

    teacher: str = _f("", "Empty = off; source = the pretrained model of model.init_from.source "
                      "run whole (every layer, one loop); else a loopline snapshot directory. "
                      "Its tokenizer must be the run's.")
    weight: float = _f(1.0, "Weight of the KL term: the objective gains weight·KL(teacher ‖ "
                       "student) per scored token, on every readout the objective scores.",
                       exclusive_minimum=0)


@dataclass
class SpikeGuardConfig:
    """Skip optimizer steps on loss spikes; abort after too many in a row."""

    enabled: bool = _f(True, "Run the spike guard.")
    warmup_steps: int = _f(20, "Steps with only the non-finite checks while baselines settle.", minimum=0)
    ema_beta: float = _f(0.98, "EMA factor of the loss baseline.", minimum=0, maximum=1)
    rel_threshold: float = _f(1.5, "Spike when loss > max(delta_floor, rel_threshold·baseline)…", minimum=1)
    delta_floor: float = _f(0.5, "…and loss − baseline exceeds this absolute floor (nats).", minimum=0)
    ratio_jump: float = _f(3.0, "Spike when loss / previous loss exceeds this ratio (and the loss "
                           "rose by more than delta_floor).", minimum=1)
    hard_jump: float = _f(5.0, "Spike when loss − previous loss exceeds this (nats).", minimum=0)
    abort_consecutive: int = _f(8, "Abort the segment after this many consecutive skipped steps.",
                                minimum=1)


@dataclass
class TrainConfig:
    """Optimisation, batch plan, loop handling and segmenting."""

    total_steps: int = _f(300, "Optimizer steps in total; 0 = from the token budget.", minimum=0)
    token_budget_multiplier: float = _f(
        20.0, "When total_steps is 0: tokens = parameters × this (Chinchilla-style).", exclusive_minimum=0)
    steps_per_segment: int = _f(100, "Optimizer steps per training job (one Snakemake job each).",
                                minimum=1)
    global_batch_rows: int = _f(16, "Rows per optimizer step over all ranks and micro-batches.", minimum=1)
    micro_batch_rows: int = _f(8, "Rows per forward/backward pass per rank.", minimum=1)
    nproc: int = _f(1, "Processes (torchrun) per training job.", minimum=1)
    nnodes: int = _f(1, "Nodes per training job; > 1 runs torchrun on each node (needs rdzv_endpoint).",
                     minimum=1)
    rdzv_endpoint: str = _f("", "host:port of the torchrun rendezvous when nnodes > 1 "
                            "(empty = $MASTER_ADDR:$MASTER_PORT).")
    optimizer: str = _f(
        "adamw", "adamw, adamatan2, or muon (torch.optim.Muon on the blocks' hidden matrices: "
        "attention, FFN, per-expert MoE matrices; AdamW on the rest: embeddings, norms, head, "
        "injection adapter, λ, router; one process only).",
        choices=["adamw", "adamatan2", "muon"])
    muon_lr: float = _f(0.0, "muon: peak learning rate of the hidden matrices (0 = same as lr).",
                        minimum=0)
    muon_momentum: float = _f(0.95, "muon: momentum μ of the hidden matrices (Nesterov).",
                              minimum=0, maximum=1)
    muon_adjust_lr: str = _f(
        "match_rms_adamw", "muon: per-matrix lr scale, match_rms_adamw (0.2·√max(rows, cols): "
        "update RMS like AdamW's, so lr and weight_decay carry over) or original "
        "(√max(1, rows/cols), Keller Jordan's; wants lr near 0.02).",
        choices=["match_rms_adamw", "original"])
    freeze: list[str] = _f(
        [], "Model parts kept fixed (requires_grad off, no optimizer state; still saved): "
        "embeddings (token and step embeddings), prelude, core, coda, head (untied), norm "
        "(final), adapter (injection_proj and a learnable λ).",
        items={"choices": list(FREEZE_PARTS)})
    lr: float = _f(3e-3, "Peak learning rate.", exclusive_minimum=0)
    min_lr_ratio: float = _f(0.1, "Final learning rate as a fraction of the peak.", minimum=0, maximum=1)
    injection_lr: float = _f(0.0, "Peak learning rate of λ (0 = same as lr).", minimum=0)
    weight_decay: float = _f(0.1, "AdamW weight decay (not on norms, biases, embeddings, λ).", minimum=0)
    beta1: float = _f(0.9, "Adam β1.", minimum=0, maximum=1)
    beta2: float = _f(0.95, "Adam β2.", minimum=0, maximum=1)
    eps: float = _f(1e-8, "Adam ε.", exclusive_minimum=0)
    schedule: str = _f("cosine", "cosine (warmup + cosine) or wsd (warmup–stable–decay).",
                       choices=["cosine", "wsd"])
    warmup_steps: int = _f(20, "Linear warmup steps.", minimum=0)
    decay_fraction: float = _f(0.2, "wsd: fraction of total steps spent decaying.", minimum=0, maximum=1)
    grad_clip: float = _f(1.0, "Clip the global gradient norm to this (0 = off).", minimum=0)
    lr_scaling: str = _f("none", "Scale lr with global batch: none, sqrt or linear.",
                         choices=["none", "sqrt", "linear"])
    reference_batch_rows: int = _f(16, "Global batch at which lr is given (for lr_scaling).", minimum=1)
    loop_sampling: LoopSamplingConfig = _f(LoopSamplingConfig(), "Loop-count sampling.")
    bptt: BpttConfig = _f(BpttConfig(), "Backpropagation through loops.")
    activation_checkpointing: str = _f(
        "none", "Recompute activations in backward instead of keeping them: none, loop (keep "
        "each loop's input state; the prelude and each readout's coda are one piece each) or "
        "block (keep each block's input). Same gradients as none, about one more forward "
        "pass of time; not with train.compile.", choices=["none", "loop", "block"])
    objective: str = _f("deep_supervision",
                        "last (loss after the last loop), deep_supervision (mean over loops); "
                        "answer_last / answer_deep_supervision: the same, scored on answer "
                        "tokens only (needs a pack with answer spans); expected_exit: "
                        "Σ_t p(t)·L_t − β·H(p) over loops 1..n with the exit gate's p (needs "
                        "model.exit_gate).",
                        choices=OBJECTIVES)
    answer_weight: float = _f(1.0, "Loss weight of answer tokens (reasoning documents, jsonl/"
                              "parquet sources with answer_field); unused by answer_* "
                              "objectives.", minimum=0)
    exit_entropy_weight: float = _f(0.01, "expected_exit: weight β of the exit distribution's "
                                    "entropy (nats), subtracted from the loss.", minimum=0)
    spike: SpikeGuardConfig = _f(SpikeGuardConfig(), "Spike guard.")
    distill: DistillConfig = _f(DistillConfig(), "Distillation from a teacher (healing a "
                                "retrofit); off unless teacher is set.")
    ema_decay: float = _f(0.0, "Keep an EMA of the weights with this decay (0 = off).", minimum=0, maximum=1)
    eval_interval: int = _f(50, "Validation loss every this many steps (0 = only at segment end).",
                            minimum=0)
    eval_rows: int = _f(32, "Validation rows per in-training evaluation (fixed slice).", minimum=1)
    val_h_eff: list[int] = _f(
        [], "Loop counts each in-training validation also reads out, from the same pass "
        "(logged as val/loss_h{H}; val_loss stays at model.loops); empty = eval.h_eff.",
        items={"minimum": 1, "maximum": MAX_TEST_LOOPS})
    diagnostics_interval: int = _f(50, "Per-block grad norm / activation RMS every N steps (0 = off).",
                                   minimum=0)
    compile: bool = _f(False, "torch.compile the model (off by default on the CPU).")
    deterministic: bool = _f(True, "torch deterministic algorithms (bit-exact resume on the CPU).")
    rollback_skip_steps: int = _f(10, "On a retry after a spike abort, skip this many steps of data.",
                                  minimum=0)
    segment_runtime_minutes: int = _f(60, "Wall-time limit of one segment job (SLURM runtime).", minimum=1)
    stop_margin_minutes: float = _f(5.0, "Stop a segment this long before its runtime ends (a resume point "
                                    "a retry continues from); 0 = only on SIGTERM/SIGUSR1.", minimum=0)
    sample_prompts: list[str] = _f(["def ", "a=3;b=a;print("],
                                   "Prompts for greedy samples written with each snapshot.")
    sample_tokens: int = _f(32, "Tokens generated per sample prompt.", minimum=0)


@dataclass
class SnapshotsConfig:
    """Which segment-end snapshots are kept (the rest are deleted once consumed)."""

    keep_last: int = _f(2, "Keep the last N segment snapshots.", minimum=1)
    keep_every: int = _f(0, "Also keep every snapshot whose step is a multiple of this (0 = off).",
                         minimum=0)
    keep_best: bool = _f(False, "Also keep the snapshot with the best validation loss.")


@dataclass
class AdaptiveExitConfig:
    """Adaptive exit (``eval.adaptive``, ``bench.adaptive``): a token stops looping at the
    first loop whose criterion passes a threshold (pipeline_lib.evaluate.exit)."""

    criteria: list[str] = _f(
        ["kl"], "Criteria, each scored on its own: kl (KL divergence of two successive "
        "readouts' next-token distributions, nats), entropy (of the current readout, nats), "
        "latent_diff (‖s_t − s_{t−1}‖/‖s_t‖ of the loop state), cosine (1 − cosine similarity "
        "of successive states), argmax_stable (top token unchanged for n loops) or gate (the "
        "learned exit gate's cumulative exit probability).", min_items=1,
        items={"choices": list(EXIT_CRITERIA)})
    thresholds: list[float] = _f(
        [], "Thresholds of every criterion not in criterion_thresholds: a token exits once its "
        "criterion value falls below one (0 = never exit early, the fixed max-loop result). "
        "Empty = adaptive exit off.", items={"minimum": 0})
    criterion_thresholds: dict[str, list[float]] = _f(
        {}, "Thresholds per criterion, overriding thresholds: argmax_stable takes loop counts n "
        "(0 = never exit), gate cumulative exit probabilities in [0, 1] (1 = never exit).")
    max_loops: int = _f(0, "Most loops a token may use (0 = the largest h_eff of the section).",
                        minimum=0, maximum=MAX_TEST_LOOPS)


@dataclass
class EvalConfig:
    """H_eff sweep: validation loss at several test-time loop counts, one pass per batch."""

    h_eff: list[int] = _f([1, 2, 4, 8], "Loop counts read out (may exceed model.loops).",
                          min_items=1, items={"minimum": 1, "maximum": MAX_TEST_LOOPS})
    max_tokens: int = _f(65536, "Validation tokens evaluated per snapshot.", minimum=1)
    batch_rows: int = _f(16, "Rows per evaluation batch.", minimum=1)
    use_ema: bool = _f(False, "Evaluate the EMA weights when the snapshot has them.")
    adaptive: AdaptiveExitConfig = _f(
        AdaptiveExitConfig(thresholds=[0.0, 1e-4, 1e-3, 1e-2, 0.1], criterion_thresholds={
            "latent_diff": [0.0, 0.01, 0.03, 0.1, 0.3], "cosine": [0.0, 1e-4, 1e-3, 1e-2, 0.1],
            "argmax_stable": [0, 1, 2, 3], "gate": [1.0, 0.99, 0.9, 0.5]}),
        "Adaptive exit of the sweep: loss and mean loops used per criterion and threshold, "
        "from the same pass as the fixed H_eff losses.")


@dataclass
class BenchSamplingConfig:
    """Sampled answers of the built-in generative tasks (``loopline_addition``): lm-eval's
    ``repeats`` with ``do_sample``, scored as pass@k and maj@k (bench.sampled)."""

    repeats: int = _f(1, "Answers sampled per question (lm-eval repeats); 1 with temperature 0 "
                      "= one greedy answer, as without sampling.", minimum=1)
    temperature: float = _f(0.0, "Sampling temperature; 0 = greedy (every repeat the same "
                            "answer).", minimum=0)
    k: list[int] = _f([], "pass@k and maj@k reported for each k (each at most repeats), with "
                      "compute per answer = k × loops per sampled answer; empty = none.",
                      items={"minimum": 1})


@dataclass
class BenchConfig:
    """Downstream benchmarks through lm-evaluation-harness."""

    tasks: list[str] = _f(["loopline_khop", "loopline_addition", "loopline_parity"],
                          "Task names: built-in loopline_* tasks, tasks of bench.include_path "
                          "or any installed lm-eval task; empty (with no include_path) = no "
                          "downstream benchmarks.")
    h_eff: list[int] = _f([1, 4, 8], "Loop counts at which every task is scored.", min_items=1,
                          items={"minimum": 1, "maximum": MAX_TEST_LOOPS})
    snapshots: str = _f("final", "Benchmark the final snapshot only, or every kept one.",
                        choices=["final", "kept"])
    examples_per_level: int = _f(40, "Built-in tasks: examples per difficulty level.", minimum=1)
    min_difficulty: int = _f(1, "Built-in tasks: smallest difficulty level.", minimum=1)
    max_difficulty: int = _f(6, "Built-in tasks: largest level (beyond training = extrapolation).",
                             minimum=1)
    seed: int = _f(10_000, "Seed of the built-in task sets (disjoint from training seeds).", minimum=0)
    batch_size: int = _f(16, "Requests per model batch.", minimum=1)
    max_gen_toks: int = _f(16, "Generation budget for generate_until tasks.", minimum=1)
    limit: int = _f(0, "Examples per lm-eval task at most (0 = all).", minimum=0)
    include_path: str = _f(
        "", "Directory of your own lm-eval task YAMLs (relative to the working directory; "
        "relative data_files are resolved against each YAML's folder). Its tasks run next to "
        "bench.tasks: all of them, unless bench.tasks names some of them. Empty = none.")
    level_field: str = _f("level", "Document field of your/installed tasks by which accuracy is "
                          "broken down per level (heatmap rows); built-in tasks use their own "
                          "level.")
    adaptive: AdaptiveExitConfig = _f(
        AdaptiveExitConfig(), "Adaptive exit of the benchmarks: every task is also scored with "
        "each token read out at its own exit (lm-eval model_args "
        "h_eff=adaptive:[CRITERION:]THRESHOLD:MAX), once per criterion and threshold, with the "
        "mean loops used and their histogram per task and level. Off by default.")
    sampling: BenchSamplingConfig = _f(
        BenchSamplingConfig(), "Sampled answers of the built-in generative tasks, scored as "
        "pass@k and maj@k at every H_eff (seeded per answer by bench.seed); off by default.")


@dataclass
class ResourcesConfig:
    """Per-job cluster resources (SLURM executor); local runs use only mem_mb and runtime."""

    slurm_partition: str = _f("", "SLURM partition for every job (empty = the cluster default).")
    slurm_account: str = _f("", "SLURM account charged (empty = your default account).")
    train_gpus: int = _f(0, "GPUs per node of a training segment job (torchrun uses train.nproc "
                            "of them).",
                         minimum=0)
    train_cpus: int = _f(1, "CPU cores (and torch threads) per training segment job.", minimum=1)
    train_mem_mb: int = _f(4000, "Memory per training segment job (MB).", minimum=100)
    eval_gpus: int = _f(0, "GPUs per evaluation or benchmark job.", minimum=0)
    eval_cpus: int = _f(1, "CPU cores (and torch threads) per evaluation or benchmark job.",
                        minimum=1)
    eval_mem_mb: int = _f(4000, "Memory per evaluation or benchmark job (MB).", minimum=100)
    eval_runtime_minutes: int = _f(60, "Wall-time limit of an evaluation or benchmark job.", minimum=1)


@dataclass
class Config:
    """The whole pipeline configuration."""

    experiment: ExperimentConfig = _f(ExperimentConfig(), "Experiment identity.")
    tracking: TrackingConfig = _f(TrackingConfig(), "MLflow tracking.")
    data: DataConfig = _f(DataConfig(), "Corpus, tokenizer and packing.")
    model: ModelConfig = _f(ModelConfig(), "Model architecture.")
    train: TrainConfig = _f(TrainConfig(), "Training.")
    snapshots: SnapshotsConfig = _f(SnapshotsConfig(), "Snapshot retention.")
    eval: EvalConfig = _f(EvalConfig(), "H_eff sweep.")
    bench: BenchConfig = _f(BenchConfig(), "Downstream benchmarks.")
    resources: ResourcesConfig = _f(ResourcesConfig(), "Cluster resources per job.")
    runs: dict[str, Any] = _f(
        {}, "Named variants, each a partial override of the sections above; one MLflow parent "
        "run and one results/{run} directory each.")


# --------------------------------------------------------------------------- loading


def _omegaconf() -> Any:
    return omegaconf().OmegaConf


def _merge(base: Any, update: Any, source: str) -> Any:
    try:
        return _omegaconf().merge(base, update)
    except omegaconf().errors.OmegaConfBaseException as exc:
        raise ConfigError(explain_omegaconf_error(exc, source, Config, update)) from None
    except TypeError as exc:  # e.g. a section given as a list, a list as a mapping
        raise ConfigError(mistyped_section(source, Config, update) or (
            f"{source}: {exc}; give sections as mappings and lists (such as data.sources) "
            "whole, e.g. data.sources=[{type: stdlib}]")) from None


def _to_object(cfg: Any, source: str) -> Config:
    """The merged OmegaConf config as a :class:`Config`. Interpolations (``${train.lr}``) are
    resolved here, as OmegaConf does; one that does not resolve (an unknown key, a missing
    environment variable, a bad grammar) is a one-line ConfigError naming the key."""
    try:
        out = _omegaconf().to_object(cfg)
    except omegaconf().errors.OmegaConfBaseException as exc:
        raise ConfigError(explain_omegaconf_error(exc, source, Config, cfg)) from None
    assert isinstance(out, Config)
    return out


def _structured(data: Mapping[str, Any] | Any, source: str) -> Config:
    OmegaConf = _omegaconf()
    schema = OmegaConf.structured(Config)
    merged = _merge(schema, data, source)
    cfg = _to_object(merged, source)
    validate_config(cfg)
    return cfg


def _follow_data(cfg: Any, updates: Sequence[Any]) -> None:
    """Set in ``cfg`` (merged, OmegaConf) the defaults that follow the data and that none of
    ``updates`` (the user's files and overrides) sets (see :func:`data_defaults`)."""
    OmegaConf = _omegaconf()
    explicit = set().union(*(set_keys(OmegaConf.to_container(u, resolve=False))
                             for u in updates))
    for key, value in data_defaults(OmegaConf.to_container(cfg, resolve=False),
                                    explicit).items():
        OmegaConf.update(cfg, key, value)


def load_config(
    path: str | Path | Sequence[str | Path] | None = None,
    overrides: Sequence[str] = (),
    *,
    base: str | Path | None = DEFAULT_CONFIG_PATH,
) -> Config:
    """Defaults ← ``base`` (config/config.yaml) ← ``path`` (one file, or several merged in
    order) ← ``key=value`` overrides.

    Sections merge key by key and lists are replaced; a file that lists ``runs:`` replaces
    the variants below it (a variant set is one unit, see :func:`merge_config_dicts`).
    """
    OmegaConf = _omegaconf()
    cfg = OmegaConf.structured(Config)
    if base is not None and Path(base).is_file():
        cfg = _merge(cfg, read_yaml(Path(base)), str(base))
    updates = []  # what the user set: files and overrides
    for file in config_paths(path, base):
        update = read_yaml(file)
        if "runs" in update:
            cfg.runs = {}
        cfg = _merge(cfg, update, str(file))
        updates.append(update)
    if overrides:
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override '{item}' must look like key=value (e.g. train.lr=1e-3)")
        try:
            dotlist = OmegaConf.from_dotlist(list(overrides))
        except Exception as exc:
            raise ConfigError(redact_text(f"cannot parse overrides {list(overrides)}: {exc}")
                              ) from None
        cfg = _merge(cfg, upgrade_legacy_keys(dotlist, "command-line override"),
                     "command-line override")
        updates.append(dotlist)
    if base is not None:  # defaults that depend on the data follow it (complete configs stay)
        _follow_data(cfg, updates)
    # where an interpolation that does not resolve was written (interpolations resolve here)
    files = [str(p) for p in config_paths(path, base)] or [str(base or "config")]
    source = ("command-line override" if any("${" in item for item in overrides)
              else " + ".join(files))
    out = _to_object(cfg, source)
    validate_config(out)
    return out


def config_from_dict(data: Mapping[str, Any], source: str = "config") -> Config:
    """Build a validated :class:`Config` from a plain (possibly partial) mapping."""
    return _structured(dict(upgrade_legacy_keys(data, source)), source)


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config (or one section) as plain, JSON-able data."""
    return dataclasses.asdict(cfg)


def public_dict(cfg: Any) -> dict[str, Any]:
    """:func:`to_dict` with the credentials of ``tracking.uri`` removed: what may be written
    to a file, a log or MLflow (see :mod:`pipeline_lib.credentials`)."""
    return redact_config(to_dict(cfg))


def config_for_run(cfg: Config, run: str) -> Config:
    """The config of variant ``run``: ``runs[run]`` merged over the other sections.

    The result has ``runs`` emptied: it is what one run directory trains and evaluates.
    """
    if run not in cfg.runs:
        known = ", ".join(sorted(cfg.runs)) or "(none)"
        raise ConfigError(f"unknown run '{run}' (config key runs.{run}); known runs: {known}")
    base = {**to_dict(cfg), "runs": {}}
    variant = cfg.runs[run] or {}
    if not isinstance(variant, Mapping):
        raise ConfigError(f"runs.{run} is {variant!r}; a variant is a mapping of sections, "
                          "e.g. {model: {loops: 4}}")
    try:
        merged = apply_data_defaults(merge_config_dicts(base, variant), set_keys(variant))
        return _structured(merged, f"runs.{run}")
    except ConfigError as exc:  # a cross-field rule broken by the variant: name it
        text = str(exc)
        raise ConfigError(text if text.startswith(f"runs.{run}") else f"runs.{run}: {text}") \
            from None


def config_hash(cfg: Any, length: int = 12) -> str:
    """Short stable hash of a config (or section): sorted-key JSON, sha256."""
    data = to_dict(cfg) if dataclasses.is_dataclass(cfg) else cfg
    if isinstance(data, Mapping):
        data = redact_config(data)  # credentials are not config: changing them changes nothing
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def config_yaml(cfg: Config) -> str:
    """The resolved config as YAML text (plain data, loadable by :func:`load_config`; what a
    snapshot's ``config.yaml`` holds); ``tracking.uri`` without credentials."""
    OmegaConf = _omegaconf()
    return OmegaConf.to_yaml(OmegaConf.create(public_dict(cfg)))


def save_config(cfg: Config, path: Path) -> None:
    """Write the resolved config as YAML (see :func:`config_yaml`)."""
    path.write_text(config_yaml(cfg))


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping → {"a.b.c": value}; lists are kept as values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


# --------------------------------------------------------------------------- validation


def check_model_shape(cfg: ModelConfig) -> None:
    """Cross-field rules of the architecture (run by :func:`validate_config` and by
    ``model.size.check_model_config`` for a ``ModelConfig`` built by hand)."""
    if cfg.head_dim:
        if cfg.head_dim % 2:
            raise ConfigError(f"model.head_dim = {cfg.head_dim} must be even for RoPE; change "
                              "it (0 = d_model / n_heads)")
    elif cfg.d_model % cfg.n_heads:
        raise ConfigError(f"model.d_model = {cfg.d_model} is not divisible by model.n_heads = "
                          f"{cfg.n_heads}; pick n_heads that divides d_model (or set "
                          "model.head_dim)")
    elif (cfg.d_model // cfg.n_heads) % 2:
        raise ConfigError(f"model.d_model / model.n_heads = {cfg.d_model // cfg.n_heads} must be "
                          "even for RoPE; change d_model or n_heads")
    if cfg.n_kv_heads and cfg.n_heads % cfg.n_kv_heads:
        raise ConfigError(f"model.n_kv_heads = {cfg.n_kv_heads} does not divide model.n_heads = "
                          f"{cfg.n_heads}; pick a divisor of n_heads (0 = n_heads)")
    if cfg.rope_scaling == "llama3" and cfg.rope_high_freq_factor <= cfg.rope_low_freq_factor:
        raise ConfigError(f"model.rope_high_freq_factor = {cfg.rope_high_freq_factor} must exceed "
                          f"model.rope_low_freq_factor = {cfg.rope_low_freq_factor} for llama3 "
                          "RoPE scaling; raise it (Llama 3.1 uses 4 and 1)")
    if cfg.moe_experts and not 1 <= cfg.moe_top_k <= cfg.moe_experts:
        raise ConfigError(f"model.moe_top_k = {cfg.moe_top_k} must be between 1 and "
                          f"model.moe_experts = {cfg.moe_experts}; lower top_k or add experts")


def validate_config(cfg: Config) -> None:
    """Range/choice checks from field metadata, then cross-field rules. Raises ConfigError."""
    check_field_constraints(cfg, "")
    check_model_shape(cfg.model)
    t, d = cfg.train, cfg.data
    per_pass = t.micro_batch_rows * t.nproc * t.nnodes  # one micro-batch on every rank
    if t.global_batch_rows % per_pass:
        nodes = (" × train.nnodes", f" × {t.nnodes}") if t.nnodes > 1 else ("", "")
        raise ConfigError(
            f"train.global_batch_rows = {t.global_batch_rows} is not a multiple of "
            f"train.micro_batch_rows × train.nproc{nodes[0]} = {t.micro_batch_rows} × "
            f"{t.nproc}{nodes[1]}; use a multiple of {per_pass}")
    if t.stop_margin_minutes >= t.segment_runtime_minutes:
        raise ConfigError(f"train.stop_margin_minutes = {t.stop_margin_minutes} leaves no time "
                          f"of train.segment_runtime_minutes = {t.segment_runtime_minutes}; "
                          "lower the margin (0 stops only on SIGTERM/SIGUSR1) or raise the runtime")
    if 0 < t.stop_margin_minutes * 60 < 1:
        raise ConfigError(f"train.stop_margin_minutes = {t.stop_margin_minutes} is under a second "
                          "(it is also the SIGUSR1 lead SLURM is asked for); use 0 or at least "
                          "0.02")
    check_optimizer_and_freeze(t, cfg.model)
    check_distill(t, cfg.model)
    check_activation_checkpointing(t)
    ls = t.loop_sampling
    if ls.min_loops > ls.max_loops:
        raise ConfigError(f"train.loop_sampling.min_loops = {ls.min_loops} exceeds max_loops = "
                          f"{ls.max_loops}; swap them")
    for i, src in enumerate(d.sources):
        check_source_fields(i, src)
    if not d.sources:
        raise ConfigError("data.sources is empty; list at least one corpus source")
    check_tokenizer(d.tokenizer)
    check_labelled_sources(d.sources, d.tokenizer)
    check_val_fraction(d)
    check_learned_positions(cfg.model, d)
    if d.curriculum_fraction > 0 and not sources_have_levels(d.sources):
        raise ConfigError(f"data.curriculum_fraction = {d.curriculum_fraction} orders documents "
                          "by level, but no source has levels; add a reasoning source or set "
                          "level_field on a jsonl/parquet source, or set it to 0")
    if t.objective.startswith("answer_") and not sources_have_answers(d.sources):
        raise ConfigError(f"train.objective = {t.objective} scores answer tokens only, but no "
                          "source has answers; add a reasoning source or set prompt_field and "
                          "answer_field on a jsonl/parquet source, or use last/deep_supervision")
    if cfg.bench.min_difficulty > cfg.bench.max_difficulty:
        raise ConfigError("bench.min_difficulty exceeds bench.max_difficulty; swap them")
    check_adaptive_exit(cfg.eval.adaptive, "eval.adaptive", cfg.model)
    check_adaptive_exit(cfg.bench.adaptive, "bench.adaptive", cfg.model)
    check_bench_sampling(cfg.bench.sampling)
    check_exit_objective(t, cfg.model)
    for name in cfg.runs:
        if not is_name(name, RUN_NAME_PATTERN):
            raise ConfigError(f"runs.{name if name.isprintable() else repr(name)}: run names "
                              "must be identifiers other than 'data' and 'compare' (letters, "
                              "digits, underscores)")
