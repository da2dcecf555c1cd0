"""Configuration: one dataclass per section (:class:`Config` the whole), each field with its
help text and bounds (:func:`~pipeline_lib.spec.fields.config_field`, ``_f``), from which the
JSON schema is generated (:mod:`.schema`). The two largest sections have modules of their own
(``config_model``, ``config_train``); loading is :mod:`.config_load`,
writing :mod:`.config_write`, validation :mod:`.rules`.

This module must stay light: the Snakefile imports it on every call (no torch, no mlflow).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config_model import ModelConfig
from .config_train import TrainConfig
from .fields import config_field as _f
from .names import LABELLED_TASKS, REASONING_TASKS
from .rules import EXIT_CRITERIA, MAX_TEST_LOOPS


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

    repeats: int = _f(1, "Answers sampled per question (lm-eval repeats), scored as pass@1, "
                      "pass@repeats and maj@repeats when > 1; 1 with temperature 0 = one "
                      "greedy answer, as without sampling.", minimum=1)
    temperature: float = _f(0.0, "Sampling temperature; 0 = greedy (every repeat the same "
                            "answer).", minimum=0)


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

