"""Summary of every kept snapshot's H_eff sweep: one long table and one figure.

Columns (:data:`COLUMNS`): the loss with its per-document bootstrap standard error
(``stderr``), the scored ``tokens`` and ``documents``, and the paired difference
loss(h) − loss(baseline H_eff, normally 1) with its 95% interval (``diff_vs_h1``,
``diff_lo``, ``diff_hi``; null on the baseline row and for sweeps written before these
statistics existed).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..figures import pyplot, save_figure

log = logging.getLogger(__name__)
COLUMNS = ("step", "h_eff", "loss", "perplexity", "tokens", "deeper_better", "stderr",
           "documents", "diff_vs_h1", "diff_lo", "diff_hi")
_TYPES = {"step": "int64", "h_eff": "int64", "loss": "float64", "perplexity": "float64",
          "tokens": "int64", "deeper_better": "bool_", "stderr": "float64", "documents": "int64",
          "diff_vs_h1": "float64", "diff_lo": "float64", "diff_hi": "float64"}


def read_sweeps(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Sweep JSON documents, sorted by step; a malformed one, or two of one snapshot, are
    named in the error."""
    sweeps, seen = [], {}
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
            doc["losses"] = {int(h): float(v) for h, v in doc["losses"].items()}
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise DataError(f"{path} is not an H_eff sweep result ({exc}); rerun its eval_heff "
                            "job") from None
        if doc.get("step") in seen:  # a file named twice, or a copy: one row set per step
            raise DataError(f"{path} and {seen[doc.get('step')]} are sweeps of the same "
                            f"snapshot (step {doc.get('step')}); pass each snapshot's sweep once")
        seen[doc.get("step")] = path
        sweeps.append(doc)
    return sorted(sweeps, key=lambda d: (d.get("step") is None, d.get("step") or 0))


def sweep_rows(sweeps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Long format: one row per (snapshot step, H_eff)."""
    rows = []
    for doc in sweeps:
        stderr = doc.get("stderr", {})
        paired = doc.get("paired", {})
        for h, loss in sorted(doc["losses"].items()):
            diff = paired.get(str(h), {})
            rows.append({"step": doc.get("step"), "h_eff": h, "loss": loss,
                         "perplexity": float(doc["perplexities"][str(h)]),
                         "tokens": int(doc["tokens"]), "deeper_better": bool(doc["deeper_better"]),
                         "stderr": stderr.get(str(h)), "documents": doc.get("documents"),
                         "diff_vs_h1": diff.get("diff"), "diff_lo": diff.get("lo"),
                         "diff_hi": diff.get("hi")})
    return rows


def write_parquet(rows: Sequence[dict[str, Any]], columns: Sequence[str],
                  types: dict[str, str], out: Path) -> None:
    """``rows`` as a parquet table of ``columns`` typed by ``types`` (pyarrow type names)."""
    import pyarrow as pa  # pyarrow: CLI --help imports this module; only writing a table needs it
    import pyarrow.parquet as pq  # pyarrow: as above

    table = pa.table({c: pa.array([r[c] for r in rows], getattr(pa, types[c])())
                      for c in columns})
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)


def plot_sweeps(sweeps: Sequence[dict[str, Any]], out: Path, title: str = "") -> None:
    """Left: loss vs H_eff, one line per snapshot. Right: loss vs step, one line per H_eff."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    cmap = plt.get_cmap("viridis")
    n = max(len(sweeps) - 1, 1)
    for i, doc in enumerate(sweeps):
        hs = sorted(doc["losses"])
        se = doc.get("stderr", {})
        left.errorbar(hs, [doc["losses"][h] for h in hs], marker="o", color=cmap(i / n),
                      yerr=[1.96 * se.get(str(h), 0.0) for h in hs], capsize=3,
                      label=f"step {doc.get('step')}")
    left.set_xscale("log", base=2)
    left.set_xlabel("test-time loops H_eff")
    left.set_ylabel("validation loss (nats/token)")
    left.set_title("loss vs H_eff per snapshot (bars: ±1.96 SE)")
    left.legend(fontsize="small")
    all_h = sorted({h for doc in sweeps for h in doc["losses"]})
    steps = [doc.get("step") for doc in sweeps]
    for j, h in enumerate(all_h):
        right.plot(steps, [doc["losses"].get(h, float("nan")) for doc in sweeps], marker="o",
                   color=plt.get_cmap("plasma")(j / max(len(all_h) - 1, 1)), label=f"H_eff={h}")
    right.set_xlabel("training step")
    right.set_ylabel("validation loss (nats/token)")
    right.set_title("loss vs step per H_eff")
    right.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    save_figure(fig, out)


def summarize_heff(inputs: Sequence[Path], out_table: Path, out_plot: Path,
                   title: str = "") -> list[dict[str, Any]]:
    """Read every sweep JSON, write the parquet table and the figure; return the rows."""
    if not inputs:
        raise DataError("summarize_heff got no sweep results; evaluate at least one snapshot")
    sweeps = read_sweeps(inputs)
    rows = sweep_rows(sweeps)
    write_parquet(rows, COLUMNS, _TYPES, out_table)
    plot_sweeps(sweeps, out_plot, title)
    log.info("H_eff summary of %d snapshots → %s, %s", len(sweeps), out_table, out_plot)
    return rows
