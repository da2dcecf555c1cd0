"""Adaptive-exit criteria: when a token stops looping, and adaptive readout for scoring.

Every criterion gives a score per token after each loop t < H; the token exits at the first
loop whose score is below the criterion's internal threshold (:func:`exit_threshold`), else
at H. In the user's units:

- ``kl``: KL(p_t ‖ p_{t−1}) of two successive readouts' next-token distributions (nats);
  p_0 is the readout of the initial state. Exit when below the threshold.
- ``entropy``: the entropy of p_t (nats) below the threshold.
- ``latent_diff``: the relative change of the loop state ‖s_t − s_{t−1}‖ / ‖s_t‖ (s_0 the
  initial state) below the threshold.
- ``cosine``: 1 − cos(s_t, s_{t−1}) of successive loop states below the threshold (a zero
  s_0 counts as cosine 0: score 1).
- ``argmax_stable``: the top token of loops t−n … t is the same (unchanged for n loops,
  counted from loop 1; so the earliest exit under n is loop n + 1). The threshold is n, a
  whole number ≥ 1; the score is −(run length), the internal threshold −n + ½.
- ``gate``: the learned exit gate's cumulative exit probability 1 − ∏_{s≤t} (1 − λ_s)
  (:mod:`pipeline_lib.model.exit_gate`) exceeds the threshold, a probability in [0, 1];
  the score is minus that probability, the internal threshold minus the user's.

The threshold that never exits early is 0 for every criterion but ``gate`` (1 there): the
scores of kl, entropy, latent_diff and cosine are clamped at 0, a run length is never
≥ ∞, and a probability never exceeds 1. That threshold reproduces the fixed H-loop result
exactly (:func:`never_exits`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import ConfigError
from ...model.exit_gate import exit_step, gate_logit
from ...spec.rules import check_exit_threshold
from .spec import CRITERIA, ExitSpec

LOGIT_CRITERIA = ("kl", "entropy")  # scored from the next-token distributions
STATE_CRITERIA = ("latent_diff", "cosine")  # scored from successive loop states


def relative_step(now: Tensor, before: Tensor) -> Tensor:
    """‖now − before‖ / ‖now‖ of loop states [..., D] per row (``latent_diff``; a latent
    trajectory's step)."""
    return (now - before).norm(dim=-1) / now.norm(dim=-1).clamp_min(1e-30)


def state_cosine(now: Tensor, before: Tensor) -> Tensor:
    """cos(now, before) of loop states [..., D] per row (a zero state: 0)."""
    return F.cosine_similarity(now, before, dim=-1, eps=1e-30)


def never_exits(criterion: str, threshold: float) -> bool:
    """Whether no token ever exits early under ``threshold`` (the fixed H-loop result)."""
    return threshold >= 1 if criterion == "gate" else threshold == 0


def exit_threshold(criterion: str, threshold: float) -> float:
    """The user's threshold as the value scores are compared with (exit: score < it)."""
    if criterion == "argmax_stable":
        return -math.inf if threshold == 0 else -float(threshold) + 0.5
    if criterion == "gate":
        return -float(threshold)
    return float(threshold)


def check_model_criterion(model: Any, criterion: str, key: str = "eval.adaptive.criteria"
                          ) -> None:
    """The gate criterion needs a snapshot trained with the exit gate (a model loaded from a
    snapshot whose gate was never trained carries why in ``untrained_exit_gate``)."""
    if criterion != "gate":
        return
    if getattr(model, "exit_gate", None) is None:
        raise ConfigError(f"{key}: criterion gate needs a snapshot with the learned exit gate "
                          "(model.exit_gate: true); pick another criterion for this snapshot")
    untrained = getattr(model, "untrained_exit_gate", None)
    if untrained:
        raise ConfigError(f"{key}: criterion gate reads the learned exit gate, but {untrained}; "
                          "its exits would be noise: train it (warm-start from this snapshot "
                          "with train.objective=expected_exit) or pick another criterion")


def exit_scores(logp: Tensor, prev_logp: Tensor | float | None, criterion: str) -> Tensor:
    """Per-row score [N] of log-probabilities [N, V]: KL(p ‖ prev) or the entropy of p, ≥ 0.

    ``prev_logp`` may be one number for every entry (−log V: the uniform distribution).
    """
    p = logp.exp()
    if criterion == "kl":
        assert prev_logp is not None, "the kl criterion needs the previous readout"
        score = torch.einsum("...v,...v->...", p, logp - prev_logp)  # 4× linalg.vecdot's speed
    else:
        score = -torch.einsum("...v,...v->...", p, logp)
    return score.clamp_min_(0.0)  # rounding can dip below 0; 0 must never exit early


class ExitTracker:
    """Scores of the state-, argmax- and gate-based criteria for rows [a] still read out,
    loop after loop (what they remember of earlier loops follows :meth:`keep`)."""

    def __init__(self, model: Any, criterion: str) -> None:
        assert criterion not in LOGIT_CRITERIA, "kl and entropy are scored from logits"
        check_model_criterion(model, criterion)
        self.model, self.criterion = model, criterion
        self.prev: Tensor | None = None  # previous state rows, top tokens or log-survival

    def start(self, state_rows: Tensor) -> None:
        """The initial loop state rows [a, D] (the states' criteria compare with it)."""
        if self.criterion in STATE_CRITERIA:
            self.prev = state_rows.float()

    def score(self, state_rows: Tensor, hidden_rows: Tensor, top: Tensor | None) -> Tensor:
        """Score [a] after one more loop: its state rows [a, D], readout hidden rows [a, D]
        and (argmax_stable) the top token of each row [a]."""
        c = self.criterion
        if c in STATE_CRITERIA:
            s, prev = state_rows.float(), self.prev
            assert prev is not None, "start() first"
            self.prev = s
            if c == "latent_diff":
                return relative_step(s, prev)
            return (1 - state_cosine(s, prev)).clamp_min_(0.0)
        if c == "argmax_stable":
            assert top is not None, "argmax_stable needs the top tokens"
            run = (torch.zeros_like(top) if self.prev is None
                   else torch.where(top == self.prev[0], self.prev[1] + 1, 0))
            self.prev = torch.stack([top, run])
            return -run.float()
        _, self.prev = exit_step(self.prev, gate_logit(self.model, hidden_rows))
        return torch.expm1(self.prev)  # −(cumulative exit probability)

    def keep(self, still: Tensor) -> None:
        """Drop the rows that stopped being read out."""
        if self.prev is not None:
            self.prev = self.prev[:, still] if self.criterion == "argmax_stable" else \
                self.prev[still]


@torch.no_grad()
def adaptive_logits(model: torch.nn.Module, batch_or_input_ids: Any, spec: ExitSpec
                    ) -> tuple[Tensor, Tensor]:
    """(logits [B, L, V], exit loop [B, L]): every position read out at its own exit loop
    under the one threshold of ``spec``, at most ``spec.max_loops`` loops.

    For lm-eval scoring and generation; the same criteria as the adaptive sweep.
    """
    criterion, threshold, max_loops = spec.criterion, spec.threshold, spec.max_loops
    if criterion not in CRITERIA:
        raise ConfigError(f"adaptive criterion {criterion!r} is not one of {list(CRITERIA)}")
    check_exit_threshold(criterion, threshold, f"adaptive {criterion} threshold")
    if max_loops < 1:
        raise ConfigError(f"adaptive max loops = {max_loops} must be at least 1")
    check_model_criterion(model, criterion, "adaptive criterion")
    ctx = model.embed(batch_or_input_ids)
    state = model.init_state(ctx)
    thr = exit_threshold(criterion, threshold)
    tracker = None if criterion in LOGIT_CRITERIA else ExitTracker(model, criterion)
    prev = None
    if criterion == "kl" and max_loops > 1:
        prev = torch.log_softmax(model.readout_logits(state, ctx).float(), dim=-1)
    if tracker is not None:
        tracker.start(state.reshape(-1, state.shape[-1]))
    out = exit_loop = done = None
    for t in range(1, max_loops + 1):
        state = model.forward_loops(ctx, t - 1, t, state)
        hidden = model.readout_hidden(state, ctx)
        logits = F.linear(hidden, model.head_weight)  # [B, L, V]
        if out is None:
            out = torch.empty_like(logits)
            exit_loop = torch.full(logits.shape[:2], max_loops, dtype=torch.int64,
                                   device=logits.device)
            done = torch.zeros(logits.shape[:2], dtype=torch.bool, device=logits.device)
        if t == max_loops:
            out[~done] = logits[~done]
            break
        logp = torch.log_softmax(logits.float(), dim=-1)
        if tracker is None:
            score = exit_scores(logp, prev, criterion)
        else:
            D = state.shape[-1]
            score = tracker.score(state.reshape(-1, D), hidden.reshape(-1, D),
                                  logp.argmax(-1).reshape(-1)).reshape(logits.shape[:2])
        new = (score < thr) & ~done
        out[new] = logits[new]
        exit_loop[new] = t
        done |= new
        prev = logp
    assert out is not None and exit_loop is not None
    return out, exit_loop
