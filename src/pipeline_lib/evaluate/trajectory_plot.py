"""The latent-trajectory figure (``trajectories.png``): paths in PCA space and the measures.

Left, large: every sampled token's path s_0..s_M projected on the two principal axes of all
states, a thin grey line per path under its states coloured by loop (one colour scale, loop
0 to M; the states after the training loop count are drawn with a black edge, so where
extrapolation starts is visible). Right: the three per-loop measures (relative step, cosine
of successive states, KL to the final readout) against the loop, the mean as a line and the
q10–q90 spread as a band, the training loop count a dashed vertical line. The title gives
the class counts. Same conventions as the other figures (Agg backend, constrained layout,
light grid, 110 dpi).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..figures import save_figure

PANELS = (("relative_step", "‖s_t − s_{t−1}‖ / ‖s_t‖", "log"),
          ("cosine", "cos(s_t, s_{t−1})", "linear"),
          ("kl_to_final", "KL(p_t ‖ p_M) (nats)", "symlog"))
KL_LINEAR = 1e-3  # nats: the KL panel is linear below this, logarithmic above (symlog)
COLOUR = "#0072B2"  # Okabe–Ito blue, as the kl criterion in the adaptive figure


def plot_trajectories(result: dict[str, Any], out: Path, title: str = "") -> Any:
    """Write the figure of one :func:`~.trajectories.trajectory_result` to ``out``; returns
    the matplotlib figure (a plain ``Figure``: pyplot never holds it)."""
    fig = Figure(figsize=(12, 6.5), layout="constrained")
    grid = fig.add_gridspec(len(PANELS), 2, width_ratios=[1.3, 1])
    _paths(fig, fig.add_subplot(grid[:, 0]), result)
    axes = [fig.add_subplot(grid[i, 1]) for i in range(len(PANELS))]
    for ax, panel in zip(axes, PANELS, strict=True):
        _measure(ax, result, *panel)
    axes[-1].set_xlabel("loop t")
    counts = ", ".join(f"{n} {name}" for name, n in result["classes"].items())
    fig.suptitle(title or f"latent trajectories of {result['tokens']} tokens "
                          f"(step {result.get('step')}): {counts}")
    return save_figure(fig, out)


def _paths(fig: Any, ax: Any, result: dict[str, Any]) -> None:
    """Every path in the PCA plane, states coloured by loop."""
    paths = np.asarray([p["pca"] for p in result["paths"]])  # [n, M+1, 2]
    loops = np.broadcast_to(np.arange(paths.shape[1]), paths.shape[:2])
    for path in paths:
        ax.plot(path[:, 0], path[:, 1], color="0.6", linewidth=0.5, alpha=0.5, zorder=1)
    past = loops > result["training_loops"]
    dots = ax.scatter(paths[..., 0][~past], paths[..., 1][~past], c=loops[~past], s=9,
                      cmap="viridis", vmin=0, vmax=result["max_loops"], zorder=2)
    if past.any():
        ax.scatter(paths[..., 0][past], paths[..., 1][past], c=loops[past], s=12,
                   cmap="viridis", vmin=0, vmax=result["max_loops"], edgecolors="black",
                   linewidths=0.4, zorder=3)
    bar = fig.colorbar(dots, ax=ax, label=f"loop (black edge: past the training count "
                                          f"{result['training_loops']})")
    bar.locator = MaxNLocator(integer=True)
    bar.update_ticks()
    ratio = result["pca"]["explained_variance_ratio"]
    ax.set_xlabel(f"PC 1 ({100 * ratio[0]:.0f}% of the variance)")
    ax.set_ylabel(f"PC 2 ({100 * ratio[1]:.0f}% of the variance)")
    ax.set_title("each token's path s_0 … s_M", fontsize="medium")
    ax.grid(True, alpha=0.25)


def _measure(ax: Any, result: dict[str, Any], name: str, label: str, scale: str) -> None:
    """One measure's mean and q10–q90 band per loop, the training loop count marked."""
    loops, summary = result["loops"], result["measures"][name]
    ax.fill_between(loops, summary["q10"], summary["q90"], color=COLOUR, alpha=0.2,
                    linewidth=0, label="q10–q90")
    ax.plot(loops, summary["mean"], color=COLOUR, marker="o", markersize=3, label="mean")
    ax.axvline(result["training_loops"], color="black", linestyle="--", linewidth=0.8,
               label=f"training loops ({result['training_loops']})")
    if scale == "log" and min(summary["q10"]) > 0:
        ax.set_yscale("log")
    elif scale == "symlog" and max(summary["q90"]) > 10 * KL_LINEAR:  # else linear is legible
        ax.set_yscale("symlog", linthresh=KL_LINEAR)
    if scale == "symlog":
        ax.set_ylim(bottom=0)  # a KL is never negative
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(label, fontsize="small")
    ax.grid(True, alpha=0.25)
    if name == PANELS[0][0]:
        ax.legend(fontsize="x-small", loc="best")
