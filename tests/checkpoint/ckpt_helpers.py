"""Tiny real training state for checkpoint tests: a tied-embedding model and AdamW after steps."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipeline_lib.checkpoint.rng import capture_rng_state
from pipeline_lib.train.optim import AdamATan2

VOCAB, DIM = 13, 8


class TinyLM(nn.Module):
    """Embedding → linear → layer norm → head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("counter", torch.zeros(2, dtype=torch.int64))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids [B, T] → loss
        h = self.norm(torch.tanh(self.mix(self.embed(ids))))  # [B, T, D]
        logits = self.head(h[:, :-1])  # [B, T-1, V]
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def train_steps(model: TinyLM, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    """Steps drawing their batches from the global torch RNG (so RNG state matters)."""
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (4, 9))
        loss = model(ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def make_optimizer(model: nn.Module, kind: str = "adamw") -> torch.optim.Optimizer:
    if kind == "adamatan2":
        return AdamATan2(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    return torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)


def make_state(seed: int = 0, steps: int = 3, kind: str = "adamw"
               ) -> tuple[TinyLM, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = TinyLM()
    opt = make_optimizer(model, kind)
    train_steps(model, opt, steps)
    return model, opt


def snapshot_kwargs(model: nn.Module, opt: torch.optim.Optimizer, **extra: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        model_state=model.state_dict(),
        optimizer_state=opt.state_dict(),
        trainer_state={"step": 3, "cursor": [0, 12], "guard": {"baselines": {"0": 2.5}}},
        rng_state=capture_rng_state(),
        config_yaml="model:\n  d_model: 8\n",
    )
    kwargs.update(extra)
    return kwargs
