"""Per-token adaptive depth: each token stops looping once its prediction has settled.

A token exits at the first loop t < H whose readout meets the criterion, else at H. The
criteria (:mod:`.criteria`): ``kl`` (Huginn's, Geiping et al. 2025,
arXiv:2502.05171: KL(p_t ‖ p_{t−1}) of two successive readouts; p_0 is the readout of the
initial state, so a token can exit after loop 1), ``entropy`` of p_t, ``latent_diff`` and
``cosine`` of successive loop states, ``argmax_stable`` (top token unchanged for n loops)
and ``gate`` (the learned exit gate's cumulative exit probability). Each criterion of
``eval.adaptive.criteria`` is its own section; all of them, and the fixed H_eff losses, come
from one pass over the loops per batch (:mod:`..sweep_pass`).

Semantics of this one-pass evaluation: every position's state keeps being computed up to H
(later tokens attend to it), and each token's prediction is read out at its own exit loop;
the "loops used" of a token is its exit loop. So the numbers say how much depth each token
needs; what a cached decoder would spend (its own exits, under each ``kv_fill``) is the
sweep's replay of that decoder (:mod:`.replay`, :mod:`.replay_loops`). The threshold that never exits
(0; 1 for gate) reproduces the fixed H-loop result exactly: the adaptive
loss is the fixed loss at H (per-token losses computed as the H_eff sweep computes them)
plus the change of every token that exits early. Every loss carries a per-document
bootstrap standard error and a paired interval against the fixed loss at H.

The family, one concept: :mod:`.spec` (what an exit is, its text form and config keys:
torch-free), :mod:`.criteria` (the scores, and every position read out at its exit for
scoring and generation: ``adaptive_logits``), :mod:`.readout` and :mod:`.runs` (the sweep's
shared readouts and one criterion's exits over a batch), :mod:`.cached` (the criteria as
cached decoding's exit rule), :mod:`.replay` and :mod:`.replay_loops` (that decoder
replayed over the sweep's rows), :mod:`.results` (the sweep JSON section), :mod:`.summary` and :mod:`.plot` (the table and figure over every snapshot). The
learned gate's exit distribution is :mod:`pipeline_lib.model.exit_gate`'s.
"""
