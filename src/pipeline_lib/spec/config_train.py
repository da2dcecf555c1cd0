"""The train section of the config: optimisation, batch plan, loops, objective, segments."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import config_field as _f
from .rules import FREEZE_PARTS, MAX_TEST_LOOPS

OBJECTIVES = ["last", "deep_supervision", "answer_last", "answer_deep_supervision",
              "expected_exit"]



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
    nnodes: int = _f(1, "Nodes per training job; > 1 runs torchrun on each node (srun in SLURM).",
                     minimum=1)
    min_nnodes: int = _f(0, "Fewest nodes a multi-node segment goes on with when nodes fail "
                         "mid-segment (SLURM, from its input snapshot on the nodes left; weights "
                         "then equal up to rounding; a lost first node still ends it, idle until "
                         "its time limit); 0 = train.nnodes: the job fails and is requeued.",
                         minimum=0)
    rdzv_endpoint: str = _f("", "host:port of the torchrun rendezvous when nnodes > 1 (empty = "
                            "$MASTER_ADDR:$MASTER_PORT, else in SLURM the job's first node, "
                            "port 20000 + job id mod 20000).")
    rdzv_timeout_s: int = _f(600, "Seconds the nodes of a multi-node job wait for each other "
                             "at the rendezvous before the job fails naming the missing ones.",
                             minimum=1)
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

