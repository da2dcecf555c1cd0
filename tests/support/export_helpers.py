"""Helpers of the export and generation tests: tiny dense, MoE and GQA models with
non-trivial weights, real snapshots of them (unsharded, and sharded by the multi-process
writer run as a one-rank gloo group), and the subprocess that loads an export with
transformers alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from pipeline_lib.spec.config import Config, SourceConfig
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.spec.config_write import save_config

SEQ_LEN = 24
WORKER = Path(__file__).with_name("hf_export_worker.py")

# Dense: tied head, additive injection with a learned λ. MoE: untied head, linear injection,
# step embedding, learned absolute positions, state initialised from the prelude output,
# non-zero balancing biases.
# GQA: 4 query heads over 2 kv heads, Llama 3 RoPE scaling whose three regimes (kept,
# interpolated, divided) all occur at head width 8 over a 64-token "original" context, and
# gated loops (their gates moved well away from 0) from a noise state (zeros in eval mode).
MODEL_CONFIGS = {
    "dense": ModelConfig(vocab_size=258, d_model=32, n_heads=2, loops=2,
                         learn_injection_scale=True, injection_scale=0.7,
                         exit_gate=True),  # the learned exit gate (test_hf_export_gate.py)
    "moe": ModelConfig(vocab_size=258, d_model=32, n_heads=2, loops=3, moe_experts=4,
                       moe_top_k=2, injection="linear", step_embedding=True,
                       state_init="embedding", tie_embeddings=False, learned_positions=64),
    "gqa": ModelConfig(vocab_size=258, d_model=32, n_heads=4, n_kv_heads=2, loops=2,
                       rope_scaling="llama3", rope_scaling_factor=4.0,
                       rope_original_max_position=64, recurrence="gated", state_init="noise"),
}


def random_model(name: str, seed: int = 0):
    """LoopedLM of ``MODEL_CONFIGS[name]`` with every weight and MoE bias perturbed (norm
    gains away from 1, biases away from 0), in eval mode."""
    from pipeline_lib.model.looped import LoopedLM

    torch.manual_seed(seed)
    model = LoopedLM(MODEL_CONFIGS[name])
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.05 * torch.randn_like(p) + (0.5 if name == "loop_gate" else 0.0))
        for buffer_name, b in model.named_buffers():
            if buffer_name.endswith("balance_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    return model.eval()


def snapshot_yaml(model_cfg: ModelConfig, where: Path) -> str:
    """The resolved config a snapshot of a model with ``model_cfg`` carries."""
    cfg = Config()
    cfg.model = model_cfg
    cfg.data.seq_len = SEQ_LEN
    cfg.data.sources = [SourceConfig(type="reasoning", max_difficulty=2)]
    cfg.experiment.device = "cpu"
    where.parent.mkdir(parents=True, exist_ok=True)
    save_config(cfg, where)
    return where.read_text()


def write_model_snapshot(out: Path, model, tokenizer, step: int = 5,
                         with_tokenizer: bool = True) -> Path:
    """A real unsharded snapshot of ``model`` (what a one-process segment writes)."""
    from pipeline_lib.checkpoint.snapshot import write_snapshot

    return write_snapshot(
        out, model_state=model.state_dict(), optimizer_state={}, trainer_state={"step": step},
        rng_state={}, config_yaml=snapshot_yaml(model.cfg, out.parent / f"{out.name}.yaml"),
        extra_files={"tokenizer.json": tokenizer.to_str()} if with_tokenizer else None)


def write_sharded_model_snapshot(out: Path, model, tokenizer, step: int = 5) -> Path:
    """A sharded snapshot (``model_dcp/``) of ``model``, by the writer every rank of a
    multi-process run calls, here as the single rank of a gloo group."""
    import torch.distributed as dist

    from pipeline_lib.checkpoint.sharded import write_sharded_snapshot

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return write_sharded_snapshot(
            out, rank=0, device=torch.device("cpu"), model_state=model.state_dict(),
            optimizer_tensors={"tok_emb.weight/step": torch.tensor(float(step))},
            optimizer_doc={"param_groups": [{"lr": 1e-3, "params": ["tok_emb.weight"]}],
                           "state_other": {}},
            trainer_state={"step": step}, rng_state={},
            config_yaml=snapshot_yaml(model.cfg, out.parent / f"{out.name}.yaml"),
            extra_files={"tokenizer.json": tokenizer.to_str()})
    finally:
        dist.destroy_process_group()


def hf_env(hf_home: Path) -> dict[str, str]:
    """Environment of a process that must not see loopline: no src/ on PYTHONPATH, offline,
    its own HF_HOME (transformers copies the remote code under it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error")
    return env


def run_hf_worker(request: dict, tmp: Path) -> dict:
    """Run ``hf_export_worker.py`` on ``request`` in a fresh process (cwd ``tmp``, where
    no loopline package lies) and return its JSON answer."""
    (tmp / "request.json").write_text(json.dumps(request))
    done = subprocess.run([sys.executable, str(WORKER), str(tmp / "request.json"),
                           str(tmp / "answer.json")], cwd=tmp, env=hf_env(tmp / "hf_home"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((tmp / "answer.json").read_text())


def library_generate(model, prompts: list[list[int]], max_loops: int, threshold: float,
                     kv_fill: str, max_new: int, eos: int
                     ) -> tuple[list[list[int]], list[list[int]], list[list[torch.Tensor]]]:
    """(new ids, loops per new token, next-token logits per new token) of loopline's cached
    adaptive greedy decoding (the decoder of its ``generate``: ``CachedNextIds`` with the
    ``gate`` criterion at ``threshold``, at most ``max_loops`` loops) of token-id
    ``prompts``; a row's last step may be the one that wrote EOS (not kept)."""
    from pipeline_lib.evaluate.exit.cached import CriterionExit
    from pipeline_lib.evaluate.exit.spec import ExitSpec
    from pipeline_lib.model.generate import CachedNextIds, greedy_decode

    rule = CriterionExit(model, ExitSpec((threshold,), "gate", max_loops))
    cached = CachedNextIds(model, max_loops, pad_id=eos, reserve=max_new, exit_rule=rule,
                           kv_fill=kv_fill)
    loops: list[list[int]] = [[] for _ in prompts]
    logits: list[list[torch.Tensor]] = [[] for _ in prompts]

    def next_ids(active: list[int], rows: list[list[int]]) -> list[int]:
        out = cached.logits(active, rows)
        for r, (i, n) in enumerate(zip(active, cached.loops, strict=True)):
            loops[i].append(n)
            logits[i].append(out[r])
        return out.argmax(-1).tolist()

    done = greedy_decode(next_ids, prompts, [max_new] * len(prompts), eos_id=eos,
                         context_len=SEQ_LEN)
    assert cached.prefills == 1, "the window never slid: one prefill, then cached steps"
    return [new for new, _ in done], loops, logits


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask) [B, width] of ``prompts`` padded on the left, as transformers'
    tokenizers pad for generation."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask
