"""How the loop state starts and how each loop updates it (``state_init``, ``recurrence``).

With x_t = inject(s_{t−1}, e) the core's input at loop t (state + λ·e, or W[state; e], plus a
step embedding when the model has one):

- ``recurrence: plain``: s_t = core(x_t).
- ``recurrence: gated``: loop 1 is the plain loop, s_1 = core(x_1); every later loop adds its
  core's increment, scaled by a learned gate (ReZero / LayerScale applied to loops):
  s_t = s_{t−1} + g_t·(core(x_t) − x_t). g_2 … g_loops start at 0, so at initialisation
  every loop after the first is an exact no-op (s_t = s_1) whose gate then learns to let it
  contribute (∂loss/∂g_t = ⟨∂loss/∂s_t, core(x_t) − x_t⟩ is not 0); loops past the table
  reuse its last gate. The core still reads e at every loop, but only its increment enters
  the state: the state holds e once (loop 1), not once per loop as plain additive injection
  with a pretrained (residual) core does. An import with every layer in order therefore
  equals the source model at every H_eff.

``state_init``: ``zeros``; ``embedding`` (s_0 = e); ``noise`` (Huginn's and McLeish et al.'s
random start): in training mode each forward pass draws s_0 from a normal of standard
deviation ``init_std`` truncated at ±:data:`NOISE_TRUNCATION`·std (Huginn's ``like-init``:
the weights' init scale), from the default torch generator, whose state the trainer
checkpoints per rank, so a resumed run draws the same noise. Outside training mode
(evaluation, generation, the export) s_0 is the distribution's mean, zeros, so readouts
are deterministic and cached decoding equals a full pass.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..spec.config_model import ModelConfig

NOISE_TRUNCATION = 3.0  # noise is cut at ± this many standard deviations


def initial_state(cfg: ModelConfig, e: Tensor, training: bool) -> Tensor:
    """s_0 [B, L, D] for the prelude output ``e`` (see the module docstring)."""
    if cfg.state_init == "embedding":
        return e
    if cfg.state_init == "noise" and training:
        std, cut = cfg.init_std, NOISE_TRUNCATION * cfg.init_std
        noise = torch.empty(e.shape, dtype=torch.float32, device=e.device)
        return nn.init.trunc_normal_(noise, std=std, a=-cut, b=cut).to(e.dtype)
    return torch.zeros_like(e)


def gated_update(state: Tensor, x: Tensor, out: Tensor, gates: Tensor, t: int) -> Tensor:
    """Loop t ≥ 1 (0-based) of gated recurrence: s + g·(core(x) − x), ``out`` = core(x)."""
    g = gates[min(t - 1, gates.numel() - 1)]
    return state + g.to(state.dtype) * (out - x)
