"""The memory estimate: exact where it counts tensors, a lower bound of what training really
holds, and far below the machine for every shipped config."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))  # the trainer's helpers
from trainer_helpers import make_pack, snap, tiny_config  # noqa: E402

from pipeline_lib.checkpoint.restore import load_snapshot  # noqa: E402
from pipeline_lib.spec.config_load import load_config  # noqa: E402
from pipeline_lib.spec.memory import (  # noqa: E402
    FP32,
    GIB,
    HALF,
    format_bytes,
    gradient_applications,
    inference_memory,
    training_memory,
)
from pipeline_lib.spec.size import param_count  # noqa: E402
from pipeline_lib.train.job import train_segment  # noqa: E402
from pipeline_lib.workflow.resolve import resolve_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# (config files merged in order, as the Makefile's targets pass them)
SHIPPED = [[], ["experiments/depth.yaml"],
           ["experiments/depth.yaml", "experiments/depth_ablation.yaml"],
           ["experiments/depth.yaml", "experiments/depth_chain.yaml"],
           ["experiments/depth_long.yaml"], ["experiments/exit_gate.yaml"],
           ["experiments/retrofit_smollm2.yaml"], ["experiments/tiny.yaml"]]
ONE_STEP = ["train.micro_batch_rows=8", "model.vocab_size=258"]  # one micro-batch a step


def parts(estimate) -> dict[str, int]:
    return dict(estimate.parts)


def test_the_state_is_counted_exactly_and_scales_with_the_ranks() -> None:
    cfg = tiny_config(*ONE_STEP, "train.ema_decay=0.9")
    p = param_count(cfg.model)
    one = parts(training_memory(cfg))
    assert (one["weights"], one["gradients"], one["adamw state"], one["EMA"]) == \
        (4 * p, 4 * p, 8 * p, 4 * p)
    acts = one["activations of train.micro_batch_rows × data.seq_len = 8 × 32 tokens"]
    # 3 loops of the core with gradients (full) and the prelude: 4 saved block inputs; the
    # logits buffer of 256 tokens × 258 ids; the ids of inputs and targets
    assert acts == 8 * 32 * (32 * HALF * 4 + 16) + 256 * 258 * FP32
    # four CPU ranks on one host: four whole models at first, each a quarter state later
    four = training_memory(cfg, world_size=4, processes=4)
    assert four.total == 4 * max(4 * p, -(-20 * p // 4)) + 4 * acts
    assert parts(four) == {
        "4 ranks' shares of weights, gradients and adamw state (each builds the whole fp32 "
        "model first)": 4 * 5 * p,
        "activations of train.micro_batch_rows × data.seq_len = 8 × 32 tokens × 4 processes":
            4 * acts}
    assert parts(training_memory(cfg, world_size=4, accelerator=True))[
        "a rank's 1/4 share of weights, gradients and adamw state (each builds the whole fp32 "
        "model first)"] == 5 * p  # 20p / 4 ≥ 4p
    frozen = parts(training_memory(tiny_config(*ONE_STEP, "train.freeze=[prelude]")))
    assert frozen["gradients"] == frozen["adamw state"] == 0  # the lower bound stays one
    assert parts(training_memory(tiny_config(*ONE_STEP, "train.optimizer=muon")))[
        "muon state"] == 4 * p


@pytest.mark.parametrize("overrides, applications", [
    ([], 4),  # fixed 3 loops, full: prelude + 3 (no coda)
    (["model.coda_layers=2", "model.core_layers=2"], 9),
    (["model.core_layers=2", "train.activation_checkpointing=loop"], 4),  # a loop's input
    (["model.core_layers=2", "train.activation_checkpointing=block"], 7),
    (["train.bptt.mode=truncated", "train.bptt.k=2"], 3),
    (["train.bptt.mode=unrolled", "train.bptt.k=1"], 2),
    (["train.bptt.mode=progressive"], 2),
    (["train.loop_sampling.mode=uniform", "train.loop_sampling.min_loops=2",
      "train.loop_sampling.max_loops=5"], 3),  # the fewest loops a step may run
    (["train.loop_sampling.mode=poisson_lognormal"], 2),
    (["train.freeze=[core]"], 1),
])
def test_gradient_applications(overrides: list[str], applications: int) -> None:
    assert gradient_applications(tiny_config(*overrides)) == applications


@pytest.mark.parametrize("overrides", [[], ["train.bptt.mode=truncated", "train.bptt.k=2"],
                                       ["model.core_layers=2",
                                        "train.activation_checkpointing=loop"],
                                       ["train.ema_decay=0.9"]])
def test_a_real_step_holds_at_least_the_estimate(tmp_path: Path, overrides: list[str]) -> None:
    """One training step of the tiny model: the snapshot's tensors are the estimated weights
    (exactly), moments and EMA (at least), and the tensors autograd saved for the backward
    pass outweigh the estimated saved block inputs."""
    cfg = tiny_config(*ONE_STEP, *overrides)
    saved: dict[int, int] = {}  # storage → bytes of what autograd saved, parameters left out

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        root = tensor if tensor._base is None else tensor._base  # a weight's transpose, …
        if tensor.is_floating_point() and not (root.is_leaf and root.requires_grad):
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        train_segment(cfg, make_pack(tmp_path / "pack"), None, 1, snap(tmp_path / "run", 1))
    snapshot = load_snapshot(snap(tmp_path / "run", 1))
    estimate = parts(training_memory(cfg))
    weights = sum(t.numel() * t.element_size() for t in snapshot.model_state.values())
    assert weights == estimate["weights"]
    moments = sum(t.numel() * t.element_size() for state in
                  snapshot.optimizer_state["state"].values() for t in state.values()
                  if isinstance(t, torch.Tensor) and t.dim() > 0)
    assert moments >= estimate["adamw state"]
    if "train.ema_decay=0.9" in overrides:
        ema = sum(t.numel() * 4 for t in snapshot.extra_tensors["ema"].values())
        assert ema >= estimate["EMA"]
    assert sum(saved.values()) >= 8 * 32 * 32 * HALF * gradient_applications(cfg)


def test_inference_counts_weights_and_the_batch() -> None:
    model = tiny_config("model.vocab_size=258").model
    p = param_count(model)
    assert inference_memory(model).total == 4 * p
    batch = inference_memory(model, rows=2, seq_len=32, rows_key="eval.batch_rows")
    assert batch.total == 4 * p + 64 * (32 * HALF + 16) + 64 * 258 * FP32
    huge = inference_memory(model, rows=10**6, seq_len=32, rows_key="eval.batch_rows")
    assert huge.subject == "eval.batch_rows × data.seq_len = 1000000 × 32 (model.d_model = 32)"
    assert huge.fix == "lower eval.batch_rows"


def test_format_bytes() -> None:
    assert [format_bytes(x) for x in (512, 3 << 20, 23.4 * GIB, 1.25 * (1 << 40), 2000 * GIB)] \
        == ["0.5 KiB", "3 MiB", "23.4 GiB", "1.25 TiB", "1.95 TiB"]


@pytest.mark.parametrize("files", SHIPPED, ids=lambda f: "+".join(f) or "config.yaml")
def test_every_shipped_run_fits_a_small_machine(files: list[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variant of the demo and experiment configs trains in well under 4 GiB by the
    estimate, so the check never refuses what the project ships (the test fixtures' configs
    pass it on every training the suite runs)."""
    monkeypatch.chdir(ROOT)  # the SmolLM2 source path is relative to the project
    base = load_config([ROOT / "config" / f for f in files] or None, [])
    for run in sorted(base.runs) or [None]:
        cfg = resolve_run(base, run).config
        vocab = cfg.model.vocab_size or cfg.data.tokenizer.vocab_size  # a BPE's: its target
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab))
        assert training_memory(cfg).total < 4 * GIB, (files, run)
