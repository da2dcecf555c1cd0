"""How much each span of a pretrained model's layers changes its residual stream.

Measured on held-out tokens of the source model run whole (every layer, in order):

- **angular distance** (Gromov et al. 2024, "The Unreasonable Ineffectiveness of the Deeper
  Layers"): ``d(i, j) = arccos(cos(h_i, h_j)) / π`` averaged over tokens, where ``h_i`` is
  the stream entering layer ``i`` (``h_0`` = the token embedding, ``h_N`` = after the last
  layer). A small ``d(a, a+m)`` says layers ``a … a+m−1`` change little: dropping them hands
  the layers after a stream close to the one they were trained on;
- **block influence** (Men et al. 2024, ShortGPT): ``BI_i = 1 − cos(h_i, h_{i+1})`` averaged
  over tokens, one layer's own change;
- **stream RMS** per layer: what scale each layer expects at its input (a looped core's
  state grows with plain re-injection; the coda was trained on ``h_q``'s scale).

Every token of the held-out rows counts (not only each sequence's last token).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..spec.names import IGNORE_INDEX


@dataclass(frozen=True)
class LayerSimilarity:
    """The source's layer-to-layer measures on one set of held-out tokens."""

    angular: np.ndarray  # [N+1, N+1] float64: d(i, j), symmetric, 0 on the diagonal
    rms: np.ndarray  # [N+1] float64: RMS of h_i over tokens and width
    tokens: int  # tokens measured

    @property
    def layers(self) -> int:
        return self.angular.shape[0] - 1

    def block_influence(self) -> np.ndarray:
        """[N]: 1 − mean cos(h_i, h_{i+1}) of each layer i."""
        return np.array([1.0 - np.cos(np.pi * self.angular[i, i + 1])
                         for i in range(self.layers)])

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens,
                "angular_distance": np.round(self.angular, 6).tolist(),
                "block_influence": np.round(self.block_influence(), 6).tolist(),
                "stream_rms": np.round(self.rms, 6).tolist()}


@torch.no_grad()
def layer_streams(model: torch.nn.Module, batch: dict[str, Tensor]) -> list[Tensor]:
    """The residual stream entering each core block and after the last, ``[h_0 … h_N]``,
    of a model imported whole (every layer as its core, one loop: the original); each
    [tokens, D] fp32 over the rows' positions whose target is scored."""
    ctx = model.context(batch)
    keep = batch["targets"].reshape(-1) != IGNORE_INDEX  # scored positions only
    h = model.tok_emb(batch["input_ids"])
    streams = [h]
    for block in model.core:
        h = block(h, ctx.rope, ctx.mask)
        streams.append(h)
    return [s.reshape(-1, s.shape[-1])[keep].float() for s in streams]


def measure(model: torch.nn.Module, batches: Iterable[dict[str, Tensor]]) -> LayerSimilarity:
    """:class:`LayerSimilarity` over every scored token of ``batches`` (summed in float64)."""
    cos_sum: np.ndarray | None = None
    sq_sum: np.ndarray | None = None
    tokens, width = 0, 0
    for batch in batches:
        streams = layer_streams(model, batch)
        unit = torch.stack([torch.nn.functional.normalize(s, dim=-1) for s in streams])
        angle = torch.arccos(torch.einsum("itd,jtd->ijt", unit, unit).clamp(-1.0, 1.0))
        part = (angle / np.pi).double().sum(-1).numpy()
        squares = torch.stack([(s.double() ** 2).sum() for s in streams]).numpy()
        cos_sum = part if cos_sum is None else cos_sum + part
        sq_sum = squares if sq_sum is None else sq_sum + squares
        tokens += streams[0].shape[0]
        width = streams[0].shape[1]
    if cos_sum is None or tokens == 0:
        raise ValueError("no scored tokens to measure the layers on")
    angular = cos_sum / tokens
    np.fill_diagonal(angular, 0.0)
    return LayerSimilarity(angular=(angular + angular.T) / 2,
                           rms=np.sqrt(sq_sum / (tokens * width)), tokens=tokens)
