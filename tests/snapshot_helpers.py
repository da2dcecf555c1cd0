"""Helpers shared by the bench tests: a tiny model config, a trainer for a fixed pattern,
a real snapshot writer, and direct (wrapper-free) computations on the model.

The pattern ``0123456789<eos>`` repeated gives greedy generation a known answer (after
``"5678"`` comes ``"9"`` then EOS), so stop strings, ``max_gen_toks`` and EOS handling are
tested against text the model really produces.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline_lib.spec.config import Config, SourceConfig
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.spec.config_write import save_config

PATTERN = "0123456789"
SEQ_LEN = 24


def tiny_model_config() -> ModelConfig:
    return ModelConfig(vocab_size=258, d_model=32, n_heads=2, prelude_layers=1, core_layers=1,
                       coda_layers=1, loops=2)


def train_pattern_model(tokenizer, steps: int = 120):
    """LoopedLM (2 training loops, deep supervision over 1..3) that has learned PATTERN."""
    from pipeline_lib.data.tokenizer import eos_id
    from pipeline_lib.model.looped import LoopedLM

    torch.manual_seed(0)
    model = LoopedLM(tiny_model_config())
    doc = tokenizer.encode(PATTERN).ids + [eos_id(tokenizer)]
    stream = torch.tensor(doc * 8)  # [88]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(len(stream) - SEQ_LEN - 1, (8,), generator=gen).tolist()
        rows = torch.stack([stream[i:i + SEQ_LEN + 1] for i in starts])  # [8, SEQ_LEN + 1]
        losses = model.losses({"input_ids": rows[:, :-1], "targets": rows[:, 1:]}, [1, 2, 3])
        loss = sum(losses.values()) / len(losses)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def write_tiny_snapshot(out: Path, model, tokenizer, step: int, with_tokenizer: bool = True,
                        total_steps: int | None = None) -> Path:
    """A real snapshot (MANIFEST, safetensors, resolved config, tokenizer.json) of ``model``;
    with ``total_steps`` (= ``step``: the run's final snapshot) in its trainer state."""
    from pipeline_lib.checkpoint.snapshot import write_snapshot

    cfg = Config()
    cfg.model = tiny_model_config()
    cfg.data.seq_len = SEQ_LEN
    cfg.data.sources = [SourceConfig(type="reasoning", max_difficulty=2)]
    cfg.experiment.device = "cpu"
    out.parent.mkdir(parents=True, exist_ok=True)
    cfg_file = out.parent / f"{out.name}.config.yaml"
    save_config(cfg, cfg_file)
    return write_snapshot(
        out, model_state=model.state_dict(), optimizer_state={},
        trainer_state={"step": step, **({"total_steps": total_steps} if total_steps else {})},
        rng_state={}, config_yaml=cfg_file.read_text(),
        extra_files={"tokenizer.json": tokenizer.to_str()} if with_tokenizer else None)


def direct_logprobs(model, tokens: list[int], h_eff: int) -> torch.Tensor:
    """log p(next token) at every position of ``tokens`` after ``h_eff`` loops: [L, V]."""
    with torch.no_grad():
        logits = model.logits_at(torch.tensor([tokens]), h_eff)[0]
    return torch.log_softmax(logits.double(), dim=-1)


def direct_continuation_logprob(model, ctx: list[int], cont: list[int], h_eff: int) -> float:
    """Sum of log p(cont | ctx), context left-truncated to SEQ_LEN + 1 - len(cont) tokens."""
    tokens = (ctx + cont)[-(SEQ_LEN + 1):]
    logp = direct_logprobs(model, tokens[:-1], h_eff)
    first = len(tokens) - len(cont)
    return float(sum(logp[i - 1, tokens[i]] for i in range(first, len(tokens))))


def greedy_reference(model, tokens: list[int], h_eff: int, max_new: int, eos: int) -> list[int]:
    """Greedy tokens after ``tokens`` (window of SEQ_LEN), stopping before EOS."""
    out: list[int] = []
    for _ in range(max_new):
        token = int(direct_logprobs(model, (tokens + out)[-SEQ_LEN:], h_eff)[-1].argmax())
        if token == eos:
            break
        out.append(token)
    return out
