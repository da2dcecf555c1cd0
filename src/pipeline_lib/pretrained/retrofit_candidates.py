"""Which prelude / core / coda choices of a pretrained model a retrofit can start from.

At a budget of B block applications per token (the original's N by default: its FLOPs) and L
training loops, a core of k layers applied L times leaves room for ``B − (L−1)·k`` distinct
layers, so ``m = N − B + (L−1)·k`` layers are dropped. loopline considers one contiguous
dropped span ``[a, a+m)`` with the core right before it (prelude ``0:a−k``, core ``a−k:a``,
coda ``a+m:N``) or right after it (prelude ``0:a``, core ``a+m:a+m+k``, coda
``a+m+k:N``): every other layer keeps its neighbours. Today's SmolLM2 default
(``0:3 / 3:9 ×4 / 27:30``), McLeish et al.'s core next to the coda (``0:3 / 21:27 ×4 /
27:30``) and pure repetition of a middle span (``0:13 / 19:21 ×4 / 21:30``) are all of
this form. With a budget that drops nothing (``m = 0``) the core may sit anywhere.

Each candidate gets a cheap pre-score, the angular distance across the span it changes
(:mod:`~pipeline_lib.retrofit.layer_similarity`): the dropped span ``d(a, a+m)``, or with
nothing dropped the core's own ``d(c, c+k)``. The pre-score only picks which candidates to
run: Gromov et al.'s distance ranks drops well but misorders pairs by 1.6–1.8 nats on
SmolLM2, so the plan measures real loss (:mod:`~pipeline_lib.retrofit.plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .hf_layout import LayerChoice


@dataclass(frozen=True)
class Candidate:
    """One prelude / core / coda choice and its pre-score."""

    choice: LayerChoice
    proxy: float  # angular distance across the span the choice changes (0…1)

    @property
    def dropped(self) -> int:
        p, c, q = self.choice.prelude, self.choice.core, self.choice.coda
        return (c[0] - p[1]) + (q[0] - c[1])

    def label(self, loops: int) -> str:
        """``0:13 / 19:21 ×4 / 21:30`` (``–`` for an empty prelude or coda)."""
        def part(r: tuple[int, int]) -> str:
            return f"{r[0]}:{r[1]}" if r[1] > r[0] else "–"
        ch = self.choice
        return f"{part(ch.prelude)} / {part(ch.core)} ×{loops} / {part(ch.coda)}"

    def applications(self, loops: int) -> int:
        counts = self.choice.counts()
        return counts["prelude_layers"] + counts["coda_layers"] + counts["core_layers"] * loops


def _placements(layers: int, k: int, m: int) -> list[tuple[LayerChoice, tuple[int, int]]]:
    """(choice, span its pre-score measures) of every core of ``k`` layers with ``m``
    layers dropped (see the module)."""
    if m == 0:  # nothing dropped: the core anywhere, the span is the core itself
        return [(LayerChoice((0, c), (c, c + k), (c + k, layers)), (c, c + k))
                for c in range(0, layers - k + 1)]
    out = []
    for a in range(0, layers - m + 1):  # dropped span [a, a+m)
        if a >= k:  # core right before it
            out.append((LayerChoice((0, a - k), (a - k, a), (a + m, layers)), (a, a + m)))
        if a + m + k <= layers:  # core right after it
            out.append((LayerChoice((0, a), (a + m, a + m + k), (a + m + k, layers)),
                        (a, a + m)))
    return out


def check_budget(layers: int, loops: int, budget: int) -> None:
    """The settings leave at least one choice (ConfigError naming the option otherwise)."""
    if loops < 2:
        raise ConfigError(f"model.loops = {loops}: a retrofit plan needs at least 2 loops (1 "
                          "loop is the original model); pass model.loops=4")
    if not _core_sizes(layers, loops, budget):
        raise ConfigError(f"--budget-blocks {budget} leaves no choice with model.loops = "
                          f"{loops} for the source's {layers} layers (a core of k layers "
                          f"applied {loops} times plus the other kept layers must make "
                          f"exactly {budget}); give e.g. {layers}, the original's FLOPs")


def _core_sizes(layers: int, loops: int, budget: int) -> list[tuple[int, int]]:
    """(core size k, layers dropped m) of every core that fits the budget exactly."""
    sizes = [(k, layers - budget + (loops - 1) * k) for k in range(1, layers + 1)]
    return [(k, m) for k, m in sizes if m >= 0 and m + k <= layers]


def enumerate_candidates(angular: np.ndarray, loops: int, budget: int) -> list[Candidate]:
    """Every choice of the module's form at ``budget`` block applications and ``loops``
    loops, ordered by pre-score (then fewer dropped layers, then position)."""
    layers = angular.shape[0] - 1
    check_budget(layers, loops, budget)
    seen: dict[LayerChoice, Candidate] = {}
    for k, m in _core_sizes(layers, loops, budget):
        for choice, (i, j) in _placements(layers, k, m):
            # import-hf's own check: a choice it would refuse is never recommended
            seen.setdefault(choice.check(layers), Candidate(choice, float(angular[i, j])))
    return sorted(seen.values(), key=lambda c: (round(c.proxy, 9), c.dropped,
                                                c.choice.core, c.choice.prelude))
