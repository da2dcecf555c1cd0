"""What lm-eval's ``loglikelihood`` needs from one forward pass, gathered on the device.

Per window: the sum of its targets' log-probabilities, whether every target is the argmax,
and the loops each target was read out after (its exit loop under adaptive exit). The log-softmax runs on the scored positions
only and stays on the device; what comes back to the CPU is three numbers per target, never
the [B, L, V] log-probabilities. The per-token values are the ones a full log-softmax over
every position gives (a row's log-softmax does not depend on the other rows), summed in
float64 on the CPU in the same order, so the loglikelihoods are the same to the bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

# (input ids, targets: the last len(targets) positions predict them); see lm_requests.Window
Window = tuple[list[int], list[int]]


@torch.inference_mode()
def target_scores(logits: Tensor, loops: Tensor, windows: Sequence[Window]
                  ) -> list[tuple[float, bool, tuple[int, ...]]]:
    """(Σ target log-probs, all targets greedy, loops used by each target) of each window.

    ``logits`` [B, L, V] and ``loops`` [B, L] of the right-padded windows' inputs (row b
    holds ``windows[b][0]``), on any device.
    """
    targets = torch.full(loops.shape, -1, dtype=torch.long)
    for b, (inputs, target) in enumerate(windows):
        targets[b, len(inputs) - len(target): len(inputs)] = torch.tensor(target)
    targets = targets.to(logits.device)
    scored = targets >= 0  # [B, L], row-major: each window's targets in order
    logp = torch.log_softmax(logits[scored].float(), dim=-1)  # [N, V]
    wanted = targets[scored]
    picked = logp.gather(1, wanted[:, None]).squeeze(1).cpu()  # [N]
    greedy = (logp.argmax(dim=-1) == wanted).cpu()
    used = loops.to(logits.device)[scored].cpu()
    counts = [len(target) for _, target in windows]
    return [(float(p.double().sum().item()), bool(g.all()), tuple(u.tolist()))
            for p, g, u in zip(picked.split(counts), greedy.split(counts), used.split(counts),
                               strict=True)]
