"""The config's validation: :func:`validate_config` runs the generic field checks
(:mod:`.fields`), then the cross-field rules, here: within one section or between sections
(sources, the tokenizer, the model's shape, ``train.optimizer = muon``, ``train.freeze``,
adaptive-exit thresholds, …). Below the section modules (``spec.config*``) in the layers, so
the sections come in as arguments (read by attribute) and nothing here imports them.
Each raises a one-line ConfigError naming the key and the fix. :data:`FREEZE_PARTS` is
the vocabulary of ``train.freeze``; what each part holds in the model is
:mod:`pipeline_lib.train.freeze`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .fields import check_field_constraints
from .names import LABELLED_TASKS, REASONING_TASKS, RUN_NAME_PATTERN, is_name

ANSWER_FIELD_SOURCE_TYPES = ("jsonl", "parquet")  # sources that read prompt/answer/level fields
FREEZE_PARTS = ("embeddings", "prelude", "core", "coda", "head", "norm", "adapter")
# adaptive-exit criteria (pipeline_lib.evaluate.exit.criteria computes them)
EXIT_CRITERIA = ("kl", "entropy", "latent_diff", "cosine", "argmax_stable", "gate")
# what cached adaptive decoding reads of a position past its exit (pipeline_lib.model.kv_cache)
KV_FILLS = ("latest", "skip")
# Most loops read out at test time (H_eff, an adaptive exit's MAX): far past any depth a
# loop count is trained or extrapolated to here, and a typo (200000) is an error, not a
# run that never ends (each loop is one core-block pass per token).
MAX_TEST_LOOPS = 1024


def check_test_loops(value: int, key: str) -> None:
    """A loop count read out at test time (``key`` names where it was given): 1 to
    :data:`MAX_TEST_LOOPS`."""
    if not 1 <= value <= MAX_TEST_LOOPS:
        raise ConfigError(f"{key} = {value}: a test-time loop count must lie between 1 and "
                          f"{MAX_TEST_LOOPS}; pass a smaller one (each loop is one more pass "
                          "of the core block per token)")


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def sources_have_levels(sources: Any) -> bool:
    """Whether any of ``data.sources`` (dataclasses or plain mappings) gives documents a
    difficulty level: a reasoning or labelled source, or a ``level_field``."""
    return any(_field(s, "type") in ("reasoning", "labelled") or _field(s, "level_field")
               for s in sources or [])


def sources_have_answers(sources: Any) -> bool:
    """Whether any of ``data.sources`` gives tokens that answer objectives score: a reasoning
    source or an ``answer_field`` (answer spans), a labelled source (its labelled tokens)."""
    return any(_field(s, "type") in ("reasoning", "labelled") or _field(s, "answer_field")
               for s in sources or [])


def model_parts(model: Any) -> list[str]:
    """The :data:`FREEZE_PARTS` the architecture ``model`` (a ``ModelConfig``) has parameters
    for: no prelude or coda without layers, no head of its own when tied to the embedding,
    an adapter only with linear injection (``injection_proj``), a learnable λ or loop gates
    (gated recurrence)."""
    has = {"prelude": model.prelude_layers > 0, "coda": model.coda_layers > 0,
           "head": not model.tie_embeddings,
           "adapter": (model.injection == "linear" or model.learn_injection_scale
                       or model.recurrence == "gated")}
    return [part for part in FREEZE_PARTS if has.get(part, True)]


def check_optimizer_and_freeze(train: Any, model: Any) -> None:
    """Muon runs in one process; ``train.freeze`` names parts the model has, and not all of
    them (``train``: a ``TrainConfig``, ``model``: a ``ModelConfig``). Raises ConfigError."""
    world = train.nproc * train.nnodes
    if train.optimizer == "muon" and world > 1:
        raise ConfigError(f"train.optimizer = muon runs in one process, not train.nproc × "
                          f"train.nnodes = {world} (FSDP shards each matrix, Newton–Schulz "
                          "needs it whole); set train.nproc=1 and train.nnodes=1 or use adamw")
    present = model_parts(model)
    if "head" in train.freeze and model.tie_embeddings and "embeddings" not in train.freeze:
        raise ConfigError("train.freeze lists head, but model.tie_embeddings shares the head "
                          "with the token embedding, which would freeze it too; list "
                          "embeddings as well, or remove head")
    for part in train.freeze:
        if part not in present and part != "head":  # a tied head: checked above
            raise ConfigError(f"train.freeze lists {part}, which this model has no parameters "
                              f"for (it has {present}); remove it")
    if not set(present) - set(train.freeze):
        raise ConfigError(f"train.freeze = {train.freeze} freezes every part of the model; "
                          "nothing would train: leave at least one part out")


def check_nodes_and_batch(t: Any) -> None:
    """``train.min_nnodes`` lies in [0, nnodes], and the global batch splits evenly over
    every world size a segment may run on (``nproc`` × each node count from ``min_nnodes``,
    or ``nnodes`` alone, to ``nnodes``): one micro-batch on every rank per pass."""
    if t.min_nnodes > t.nnodes:
        raise ConfigError(f"train.min_nnodes = {t.min_nnodes} exceeds train.nnodes = "
                          f"{t.nnodes}; use at most {t.nnodes} (0 = no continuing on fewer)")
    counts = range(t.min_nnodes or t.nnodes, t.nnodes + 1)
    unit = math.lcm(*(t.micro_batch_rows * t.nproc * n for n in counts))
    if t.global_batch_rows % unit == 0:
        return
    if len(counts) > 1:
        raise ConfigError(
            f"train.global_batch_rows = {t.global_batch_rows} does not split over every node "
            f"count from train.min_nnodes = {t.min_nnodes} to train.nnodes = {t.nnodes} (× "
            f"train.nproc {t.nproc} × train.micro_batch_rows {t.micro_batch_rows}); use a "
            f"multiple of {unit}, or raise train.min_nnodes")
    nodes = (" × train.nnodes", f" × {t.nnodes}") if t.nnodes > 1 else ("", "")
    raise ConfigError(
        f"train.global_batch_rows = {t.global_batch_rows} is not a multiple of "
        f"train.micro_batch_rows × train.nproc{nodes[0]} = {t.micro_batch_rows} × "
        f"{t.nproc}{nodes[1]}; use a multiple of {unit}")


def check_distill(train: Any, model: Any) -> None:
    """``train.distill.teacher``: off, ``source`` (needs ``model.init_from.source``) or an
    existing snapshot directory; not with the expected-exit objective. The teacher's
    tokenizer is compared with the pack's when the segment starts."""
    teacher, key = train.distill.teacher, "train.distill.teacher"
    if not teacher:
        return
    if train.objective == "expected_exit":
        raise ConfigError(f"{key} is set, but train.objective = expected_exit weighs its "
                          "readouts by the exit gate, which distillation does not; use last "
                          "or deep_supervision (or an answer_* objective), or teacher: ''")
    if teacher == "source":
        if not model.init_from.source:
            raise ConfigError(f"{key} = source, but model.init_from.source is empty: there is "
                              "no pretrained model to distill from; set model.init_from.source "
                              "or name a loopline snapshot directory as the teacher")
        return
    if not Path(teacher).expanduser().is_dir():
        raise ConfigError(f"{key} = {teacher!r} is neither source nor a snapshot directory; "
                          "use source, a path to a loopline snapshot, or '' (off)")


def check_activation_checkpointing(train: Any) -> None:
    """``train.activation_checkpointing`` runs eagerly (``train``: a ``TrainConfig``): under
    torch.compile checkpoint's ``context_fn`` must be a dispatch mode, and the marker that
    keeps a recomputed MoE call from counting its loads and aux term twice is not one."""
    if train.activation_checkpointing != "none" and train.compile:
        raise ConfigError(f"train.activation_checkpointing = {train.activation_checkpointing} "
                          "does not combine with train.compile (compiled checkpoint regions "
                          "cannot mark recomputation, which MoE load counting needs); set "
                          "train.compile=false or train.activation_checkpointing=none")


def check_source_fields(i: int, src: Any) -> None:
    """``data.sources[i]`` (a SourceConfig): prompt_field/answer_field come as a pair, and
    only jsonl/parquet read them (and level_field); file sources need a path; a generator
    source's tasks are its own kind's."""
    if src.type in ("parquet", "jsonl", "text") and not src.path:
        raise ConfigError(f"data.sources[{i}].path is empty for a {src.type} source; "
                          "set it to a file glob")
    if src.min_difficulty > src.max_difficulty:
        raise ConfigError(f"data.sources[{i}].min_difficulty exceeds max_difficulty; swap them")
    _check_tasks(i, src)
    fields = {"prompt_field": src.prompt_field, "answer_field": src.answer_field,
              "level_field": src.level_field}
    used = [name for name, value in fields.items() if value]
    if used and src.type not in ANSWER_FIELD_SOURCE_TYPES:
        raise ConfigError(f"data.sources[{i}].{used[0]} is set on a {src.type} source; only "
                          "jsonl and parquet sources read it, remove it")
    if bool(src.prompt_field) != bool(src.answer_field):
        given, missing = (("prompt_field", "answer_field") if src.prompt_field
                          else ("answer_field", "prompt_field"))
        raise ConfigError(f"data.sources[{i}].{given} is set without {missing}; set both "
                          "(the document is prompt + answer) or neither")


def _check_tasks(i: int, src: Any) -> None:
    """A reasoning source draws from the reasoning generators, a labelled source without a
    path from the labelled ones (``tasks`` holds the names of both kinds)."""
    own = {"reasoning": REASONING_TASKS, "labelled": LABELLED_TASKS}.get(src.type)
    if own is None or (src.type == "labelled" and src.path):
        return
    other = next((t for t in src.tasks if t not in own), None)
    if other is not None:
        raise ConfigError(f"data.sources[{i}].tasks lists {other!r}, which is not a {src.type} "
                          f"task; a {src.type} source draws from {list(own)}: list only those")


def check_labelled_sources(sources: Any, tok: Any) -> None:
    """A pack is labelled or not: labelled sources do not mix with others, and their records
    are bytes or token ids of an existing vocabulary (no BPE trained on a corpus without
    text). ``sources``: ``data.sources``; ``tok``: ``data.tokenizer``."""
    kinds = [s.type == "labelled" for s in sources]
    if not any(kinds):
        return
    if not all(kinds):
        i, j = kinds.index(True), kinds.index(False)
        raise ConfigError(f"data.sources[{i}] is labelled but data.sources[{j}] "
                          f"({sources[j].type}) is not: a pack is labelled or not; pack them "
                          "in separate configs, or make every source labelled")
    if tok.type == "bpe":
        raise ConfigError("data.tokenizer.type = bpe trains its vocabulary on the corpus text, "
                          "but labelled sources give bytes or token ids; use type byte, or type "
                          "file with the tokenizer your input_ids come from")


def check_learned_positions(model: Any, data: Any) -> None:
    """A learned position table holds every position of a training row."""
    if 0 < model.learned_positions < data.seq_len:
        raise ConfigError(f"model.learned_positions = {model.learned_positions} is shorter than "
                          f"data.seq_len = {data.seq_len}: positions past the table have no "
                          "embedding; set model.learned_positions to data.seq_len")


def check_val_fraction(data: Any) -> None:
    """``data.val_fraction`` may be 0 only when a heldout source fills the validation split."""
    if data.val_fraction == 0 and not any(s.heldout for s in data.sources):
        raise ConfigError(f"config key data.val_fraction = {float(data.val_fraction)} must be "
                          "greater than 0 unless a source is heldout (nothing would be "
                          "validated); raise it, or set heldout: true on a test source")


def check_tokenizer(tok: Any) -> None:
    """``data.tokenizer`` (a TokenizerConfig): type file reads path; byte and bpe read
    neither a path nor a BOS setting."""
    if tok.type == "file" and not tok.path:
        raise ConfigError("data.tokenizer.path is empty for a file tokenizer; set it to a "
                          "tokenizer.json, a Hugging Face tokenizer directory or a .gguf file")
    if tok.type != "file" and tok.path:
        raise ConfigError(f"data.tokenizer.path is set for a {tok.type} tokenizer; only type "
                          "file reads it: set data.tokenizer.type to file or remove the path")
    if tok.type != "file" and tok.add_bos == "true":
        raise ConfigError(f"data.tokenizer.add_bos = true, but a {tok.type} tokenizer has no BOS "
                          "token; set it to auto or false (or use type file)")


def check_exit_threshold(criterion: str, value: float, key: str) -> None:
    """One adaptive-exit threshold of ``criterion`` (what ``key`` names in the message):
    finite and >= 0; a whole loop count for argmax_stable; within [0, 1] for gate."""
    if criterion not in EXIT_CRITERIA:
        raise ConfigError(f"{key}: criterion {criterion!r} is not one of {list(EXIT_CRITERIA)}; "
                          "pick one")
    if not 0 <= value < float("inf"):  # also nan
        raise ConfigError(f"{key} = {value} must be a finite number >= 0 (0 = never exit "
                          "early), e.g. 0.01")
    if criterion == "argmax_stable" and value != int(value):
        raise ConfigError(f"{key} = {value}: argmax_stable takes a whole number n of loops the "
                          "top token stays unchanged (0 = never exit), e.g. 2")
    if criterion == "gate" and value > 1:
        raise ConfigError(f"{key} = {value}: the gate threshold is a cumulative exit "
                          "probability in [0, 1] (1 = never exit), e.g. 0.9")


def check_adaptive_exit(adaptive: Any, key: str, model: Any) -> None:
    """An adaptive-exit section (``adaptive``, an AdaptiveExitConfig, at ``key``:
    ``eval.adaptive`` or ``bench.adaptive``): every threshold fits its criterion; the gate
    criterion needs the exit gate."""
    for x in adaptive.thresholds:
        check_exit_threshold("kl", x, f"{key}.thresholds")
        for name in dict.fromkeys(adaptive.criteria):
            if name not in adaptive.criterion_thresholds:
                check_exit_threshold(name, x, f"{key}.thresholds ({name})")
    for name, values in adaptive.criterion_thresholds.items():
        for x in values:
            check_exit_threshold(name, x, f"{key}.criterion_thresholds.{name}")
    if adaptive.thresholds and "gate" in adaptive.criteria and not model.exit_gate:
        raise ConfigError(f"{key}.criteria lists gate, but model.exit_gate is false; set "
                          "model.exit_gate=true or remove gate from the criteria")


def check_exit_objective(train: Any, model: Any) -> None:
    """The exit gate's objective needs the gate; expected_exit reads out every loop of one
    pass, so not with unrolled backprop."""
    if train.objective == "expected_exit" and not model.exit_gate:
        raise ConfigError("train.objective = expected_exit needs the learned exit gate; set "
                          "model.exit_gate=true or pick another objective")
    if train.objective == "expected_exit" and train.bptt.mode == "unrolled":
        raise ConfigError("train.objective = expected_exit weighs every loop's readout in one "
                          "pass; use train.bptt.mode full or truncated, not unrolled")


def check_exit_gate_trained(train: Any, model: Any) -> None:
    """A config about to train: ``model.exit_gate`` only with the objective that trains it.

    Only ``expected_exit`` puts the gate in the loss; under any other objective it keeps its
    initial weights, and a gate exit would read noise. Checked where a run is planned and
    where a segment starts, not when a snapshot's config is read: snapshots trained before
    this rule still load (their gate is refused by the gate criterion instead)."""
    if model.exit_gate and train.objective != "expected_exit":
        raise ConfigError(f"model.exit_gate = true, but train.objective = {train.objective} "
                          "never trains the gate (only expected_exit does), so its exits "
                          "would be noise; set train.objective=expected_exit, or "
                          "model.exit_gate=false")




def check_model_shape(cfg: Any) -> None:
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


def validate_config(cfg: Any) -> None:
    """Range/choice checks from field metadata, then the cross-field rules (a whole
    :class:`~pipeline_lib.spec.config.Config`). Raises ConfigError."""
    check_field_constraints(cfg, "")
    check_model_shape(cfg.model)
    t, d = cfg.train, cfg.data
    check_nodes_and_batch(t)
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
    check_exit_objective(t, cfg.model)
    for name in cfg.runs:
        if not is_name(name, RUN_NAME_PATTERN):
            raise ConfigError(f"runs.{name if name.isprintable() else repr(name)}: run names "
                              "must be identifiers other than 'data' and 'compare' (letters, "
                              "digits, underscores)")
