"""Summary of the label accuracy of every kept snapshot's sweep: a table and a figure.

``eval/heff_labels.parquet`` (:data:`COLUMNS`): one row per (snapshot step, level, H_eff)
with the label accuracy, its 95% document-bootstrap interval (``lo``, ``hi``), the exact-match
rate and whether the level lies beyond the training levels; ``level`` null (and
``beyond_training`` null) on the rows over all documents. ``eval/heff_labels.png``: accuracy
against H_eff of the last snapshot with labels, one line per level (levels beyond training
dashed, all documents in black), 95% bands, and a vertical line at the deepest loop count the
snapshot trained with: what loops past it buy, or cost.

Sweeps of unlabelled packs have no ``labels`` section and contribute no rows; with none at
all the table is empty and the figure says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..figures import pyplot, save_figure
from .heff_summary import read_sweeps, write_parquet

log = logging.getLogger(__name__)
COLUMNS = ("step", "level", "h_eff", "accuracy", "lo", "hi", "exact_match", "beyond_training")
_TYPES = {"step": "int64", "level": "int64", "h_eff": "int64", "accuracy": "float64",
          "lo": "float64", "hi": "float64", "exact_match": "float64", "beyond_training": "bool_"}


def _blocks(labels: dict[str, Any]) -> list[tuple[int | None, dict[str, Any]]]:
    """(level, block) of one labels section: every level ascending, then all (None)."""
    levels = sorted(labels["levels"].items(), key=lambda item: int(item[0]))
    return [(int(lv), block) for lv, block in levels] + [(None, labels["all"])]


def label_rows(sweeps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Long format: one row per (snapshot step, level or all, H_eff) of the labelled sweeps."""
    rows = []
    for doc in sweeps:
        if not doc.get("labels"):
            continue
        for level, block in _blocks(doc["labels"]):
            for h in sorted(block["accuracy"], key=int):
                lo, hi = block["accuracy_ci"][h]
                rows.append({"step": doc.get("step"), "level": level, "h_eff": int(h),
                             "accuracy": block["accuracy"][h], "lo": lo, "hi": hi,
                             "exact_match": block["exact_match"][h],
                             "beyond_training": block.get("beyond_training")})
    return rows


def plot_labels(sweeps: Sequence[dict[str, Any]], out: Path, title: str = "") -> None:
    """Label accuracy vs H_eff of the last labelled snapshot, one line per level."""
    plt = pyplot()
    shown = [doc for doc in sweeps if doc.get("labels")]
    fig, ax = plt.subplots(figsize=(9, 5), layout="constrained")
    fig.suptitle(title or "label accuracy vs H_eff")
    if not shown:
        ax.text(0.5, 0.5, "no labelled documents\n(the pack carries no labels)", ha="center",
                va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        _draw(ax, shown[-1], plt.get_cmap("viridis"))
    save_figure(fig, out)


def _draw(ax: Any, doc: dict[str, Any], cmap: Any) -> None:
    labels = _blocks(doc["labels"])
    n = max(len(labels) - 2, 1)
    hs = sorted({int(h) for _, block in labels for h in block["accuracy"]})
    for i, (level, block) in enumerate(labels):
        xs = sorted(block["accuracy"], key=int)
        acc = [block["accuracy"][h] for h in xs]
        band = [block["accuracy_ci"][h] for h in xs]
        beyond = bool(block.get("beyond_training"))
        colour = "black" if level is None else cmap(0.9 * i / n)
        name = "all documents" if level is None else \
            f"level {level}" + (" (beyond training)" if beyond else "")
        ax.plot([int(h) for h in xs], acc, color=colour, marker="o", markersize=4,
                linestyle="--" if beyond else "-", linewidth=2.2 if level is None else 1.4,
                label=f"{name}, {block['documents']} docs")
        ax.fill_between([int(h) for h in xs], [b[0] for b in band], [b[1] for b in band],
                        color=colour, alpha=0.1, linewidth=0)
    train_max = doc["labels"].get("train_max_loops")
    if train_max:
        ax.axvline(train_max, color="grey", linestyle=":", linewidth=1.2,
                   label=f"deepest training loops ({train_max})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(hs, [str(h) for h in hs])
    ax.minorticks_off()
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("test-time loops H_eff")
    ax.set_ylabel("label accuracy (per token; bands: 95% document bootstrap)")
    ax.set_title(f"step {doc.get('step')}", fontsize="medium")
    ax.grid(True, alpha=0.25)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              fontsize="small")


def summarize_labels(inputs: Sequence[Path], out_table: Path, out_plot: Path,
                     title: str = "") -> list[dict[str, Any]]:
    """Read every sweep JSON, write the label-accuracy table and figure; return the rows."""
    sweeps = read_sweeps(inputs)
    rows = label_rows(sweeps)
    write_parquet(rows, COLUMNS, _TYPES, out_table)
    plot_labels(sweeps, out_plot, title)
    log.info("label-accuracy summary: %d rows → %s, %s", len(rows), out_table, out_plot)
    return rows
