"""A retrofit plan as a table (``plan.md``, also printed) and one figure (``plan.png``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ..figures import save_figure

SHOWN = 6  # candidates drawn in the figure (the table lists every measured one)


def _interval(d: dict[str, float]) -> str:
    return f"{d['diff']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]"


def plan_markdown(result: dict[str, Any]) -> str:
    """The ranked table: loss at each H_eff, the paired difference to the original at the
    ranking H_eff, drift, scale, layers dropped, FLOPs; then the best choice as config."""
    hs = [str(h) for h in result["h_eff"]]
    at = str(result["ranked_at_h_eff"])
    orig = result["original"]
    lines = [f"Retrofit plan for `{result['source']}` ({result['layers']} layers, "
             f"{result['loops']} loops, {result['budget_blocks']} block applications per "
             f"token): {len(result['candidates'])} of {result['candidates_considered']} "
             f"choices measured on {result['tokens']} held-out tokens "
             f"({result['documents']} documents). Original: {orig['loss']:.3f} nats/token.",
             "",
             "| rank | prelude / core × loops / coda | " + " | ".join(f"H_eff {h}" for h in hs)
             + f" | vs original at {at} (95% CI) | drift | state/coda RMS | dropped | "
             "FLOPs/token | pre-score |",
             "|---" * (len(hs) + 8) + "|"]
    for i, c in enumerate(result["candidates"], 1):
        losses = " | ".join(f"{c['losses'][h]:.3f}" for h in hs)
        lines.append(f"| {i} | {c['label']} | {losses} | {_interval(c['vs_original'][at])} | "
                     f"{c['drift']:.3f} | {c['rms_ratio']:.2f} | {c['dropped_layers']} | "
                     f"{c['flops_per_token']:.3g} | {c['pre_score']:.3f} |")
    best = result["candidates"][0]["init_from"]
    lines += ["", "Best choice (`model.init_from`, with `source` and `adapter` as in the "
              "config):", "", "```yaml", "model:", f"  loops: {result['loops']}",
              "  init_from:", f"    prelude: {best['prelude']}", f"    core: {best['core']}",
              f"    coda: {best['coda']}", "```", ""]
    return "\n".join(lines)


def plan_figure(result: dict[str, Any], out: Path) -> None:
    """Left: angular distance d(i, i+n) of the source's layers (Gromov et al.); right: the
    measured candidates' loss at each H_eff with 95% intervals, the original as a band."""
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    heat, curves = fig.subplots(1, 2)
    ang = np.asarray(result["layers_measured"]["angular_distance"])
    n = ang.shape[0] - 1
    grid = np.full((n, n), np.nan)  # [span n-1, start i]
    for span in range(1, n + 1):
        for i in range(0, n - span + 1):
            grid[span - 1, i] = ang[i, i + span]
    image = heat.imshow(grid, origin="lower", aspect="auto", cmap="viridis",
                        extent=(-0.5, n - 0.5, 0.5, n + 0.5))
    fig.colorbar(image, ax=heat, label="angular distance d(i, i+n)")
    heat.set(xlabel="first layer i", ylabel="layers spanned n",
             title="how much each span of layers changes the stream")
    hs = result["h_eff"]
    orig = result["original"]["loss"]
    curves.axhline(orig, color="black", lw=1.2, label=f"original ({orig:.2f})")
    for c in result["candidates"][:SHOWN]:
        diffs = [c["vs_original"][str(h)] for h in hs]
        y = [c["losses"][str(h)] for h in hs]
        err = [[d["diff"] - d["lo"] for d in diffs], [d["hi"] - d["diff"] for d in diffs]]
        curves.errorbar(hs, y, yerr=err, marker="o", capsize=3, label=c["label"])
    curves.axvline(result["loops"], color="grey", ls=":", lw=1)
    curves.set(xscale="log", xticks=hs, xticklabels=[str(h) for h in hs], xlabel="H_eff (loops)",
               ylabel="loss at step 0 (nats/token)",
               title=f"measured choices (95% CI, {result['tokens']} tokens)")
    curves.legend(fontsize=7)
    fig.suptitle(f"retrofit plan: {Path(result['source']).name}")
    save_figure(fig, out)
