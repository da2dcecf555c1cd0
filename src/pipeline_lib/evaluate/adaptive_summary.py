"""Summary of the adaptive-exit sections of every kept snapshot's sweep: a table and a figure.

``eval/heff_adaptive.parquet`` (:data:`COLUMNS`): one row per (snapshot step, criterion,
threshold),
with the loss, its per-document bootstrap standard error, the mean loops used and the
paired difference to the fixed loss at ``max_loops`` (``diff_vs_fixed`` and its 95%
interval). ``eval/heff_adaptive.png``: loss against (mean) loops used, the adaptive points
of every criterion and the fixed-H_eff points of each snapshot on the same axes, so one reads off whether an
exit rule reaches a fixed depth's loss with fewer loops.

Sweeps without an ``adaptive`` section (``eval.adaptive_thresholds: []``, or written before
adaptive exit existed) contribute no rows; with none at all the table is empty and the
figure says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .heff_summary import read_sweeps, write_parquet

log = logging.getLogger(__name__)
COLUMNS = ("step", "criterion", "max_loops", "threshold", "loss", "stderr", "mean_loops",
           "tokens", "fixed_loss", "diff_vs_fixed", "diff_lo", "diff_hi")
_TYPES = {"step": "int64", "criterion": "string", "max_loops": "int64", "threshold": "float64",
          "loss": "float64", "stderr": "float64", "mean_loops": "float64", "tokens": "int64",
          "fixed_loss": "float64", "diff_vs_fixed": "float64", "diff_lo": "float64",
          "diff_hi": "float64"}


MARKERS = {"kl": "s", "entropy": "^", "latent_diff": "D", "cosine": "v", "argmax_stable": "P",
           "gate": "*"}


def sections(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The adaptive sections of one sweep, one per criterion: ``adaptive_by_criterion``, or
    the lone ``adaptive`` of sweeps written before several criteria."""
    if doc.get("adaptive_by_criterion"):
        return list(doc["adaptive_by_criterion"].values())
    return [doc["adaptive"]] if doc.get("adaptive") else []


def adaptive_rows(sweeps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Long format: one row per (snapshot step, criterion, threshold) of the sweeps."""
    rows = []
    for doc in sweeps:
        for section in sections(doc):
            _section_rows(doc, section, rows)
    return rows


def _section_rows(doc: dict[str, Any], section: dict[str, Any], rows: list) -> None:
    for point in section["points"]:
        diff = point.get("vs_fixed", {})
        rows.append({"step": doc.get("step"), "criterion": section["criterion"],
                     "max_loops": int(section["max_loops"]),
                     "threshold": float(point["threshold"]), "loss": float(point["loss"]),
                     "stderr": point.get("stderr"), "mean_loops": float(point["mean_loops"]),
                     "tokens": int(point["tokens"]), "fixed_loss": section.get("fixed_loss"),
                     "diff_vs_fixed": diff.get("diff"), "diff_lo": diff.get("lo"),
                     "diff_hi": diff.get("hi")})


def write_adaptive_table(rows: Sequence[dict[str, Any]], out: Path) -> None:
    write_parquet(rows, COLUMNS, _TYPES, out)


def plot_adaptive(sweeps: Sequence[dict[str, Any]], out: Path, title: str = "") -> None:
    """Loss vs loops used: fixed H_eff (circles, solid) and every criterion's adaptive exit
    (one marker per criterion, dashed, labelled with thresholds on the last snapshot), one
    colour per snapshot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5), constrained_layout=True)
    with_adaptive = [doc for doc in sweeps if sections(doc)]
    cmap = plt.get_cmap("viridis")
    n = max(len(with_adaptive) - 1, 1)
    for i, doc in enumerate(with_adaptive):
        colour, step = cmap(i / n), doc.get("step")
        hs = sorted(int(h) for h in doc["losses"])
        stderr = doc.get("stderr", {})
        ax.errorbar(hs, [doc["losses"][h] for h in hs],
                    yerr=[stderr.get(str(h), 0.0) for h in hs], marker="o", color=colour,
                    capsize=2, label=f"step {step}: fixed H_eff")
        for section in sections(doc):
            _plot_section(ax, section, colour, step, i == len(with_adaptive) - 1)
    if with_adaptive:
        ax.set_xscale("log", base=2)
        ax.legend(fontsize="x-small")
    else:
        ax.text(0.5, 0.5, "no adaptive-exit results\n(eval.adaptive_thresholds is empty)",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("loops used per token (fixed: H_eff; adaptive: mean exit loop)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(title or "adaptive exit vs fixed depth")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _plot_section(ax: Any, section: dict[str, Any], colour: Any, step: Any, label: bool) -> None:
    points = sorted(section["points"], key=lambda p: p["mean_loops"])
    ax.errorbar([p["mean_loops"] for p in points], [p["loss"] for p in points],
                yerr=[p.get("stderr") or 0.0 for p in points],
                marker=MARKERS.get(section["criterion"], "s"), linestyle="--", color=colour,
                capsize=2, label=f"step {step}: adaptive ({section['criterion']}, ≤ "
                                 f"{section['max_loops']} loops)")
    if label:
        for p in points:
            ax.annotate(f"{p['threshold']:g}", (p["mean_loops"], p["loss"]),
                        textcoords="offset points", xytext=(4, 4), fontsize="x-small")


def summarize_adaptive(inputs: Sequence[Path], out_table: Path, out_plot: Path,
                       title: str = "") -> list[dict[str, Any]]:
    """Read every sweep JSON, write the adaptive table and figure; return the rows."""
    sweeps = read_sweeps(inputs)
    rows = adaptive_rows(sweeps)
    write_adaptive_table(rows, out_table)
    plot_adaptive(sweeps, out_plot, title)
    log.info("adaptive-exit summary: %d rows → %s, %s", len(rows), out_table, out_plot)
    return rows
