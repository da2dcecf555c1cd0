"""Cross-variant comparison: one table, a markdown summary and plots over every run.

Per variant it reads the final snapshot's H_eff sweep (``eval/heff.parquet``), the final
benchmark JSON (``bench/step_….json``) and the training curve (``train/metrics.jsonl``).
The MLflow UI shows the same numbers run by run; this is the side-by-side view that also
lands in ``snakemake --report``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DataError

log = logging.getLogger(__name__)
TAIL_STEPS = 10  # final training loss = mean over the last this many logged steps


@dataclass
class RunResults:
    """What one variant contributes to the comparison."""

    name: str
    final_step: int
    val_loss: dict[int, float]  # H_eff → validation loss at the final snapshot
    accuracy: dict[str, dict[int, float]]  # task → H_eff → main metric at the final snapshot
    train_curve: list[tuple[int, float]]  # (step, loss) of non-skipped steps

    @property
    def final_train_loss(self) -> float | None:
        tail = [loss for _, loss in self.train_curve[-TAIL_STEPS:]]
        return sum(tail) / len(tail) if tail else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} cannot be read as JSON ({exc}); rerun the stage that writes "
                        "it") from None


def _train_curve(metrics_jsonl: Path) -> list[tuple[int, float]]:
    if not metrics_jsonl.is_file():
        log.warning("%s is missing; the comparison has no training curve for it", metrics_jsonl)
        return []
    curve = []
    for line in metrics_jsonl.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if not rec.get("skipped") and rec.get("loss") is not None:
                curve.append((int(rec["step"]), float(rec["loss"])))
    return curve


def load_run_results(name: str, heff_table: Path, bench_json: Path,
                     metrics_jsonl: Path) -> RunResults:
    """Final-snapshot numbers of one variant."""
    import pyarrow.parquet as pq

    rows = pq.read_table(heff_table).to_pylist()
    if not rows:
        raise DataError(f"{heff_table} is empty; rerun summarize_heff for run {name}")
    final_step = max(r["step"] for r in rows)
    val_loss = {int(r["h_eff"]): float(r["loss"]) for r in rows if r["step"] == final_step}
    bench = _read_json(bench_json)
    accuracy: dict[str, dict[int, float]] = {}
    for task, info in bench.get("tasks", {}).items():
        metric = info.get("metric")
        per_h = {int(h): float(s["overall"][metric]) for h, s in info["h_eff"].items()
                 if metric in s.get("overall", {})}
        if per_h:
            accuracy[f"{task}/{metric}"] = per_h
    return RunResults(name, final_step, val_loss, accuracy, _train_curve(metrics_jsonl))


def comparison_rows(runs: Sequence[RunResults]) -> list[dict[str, Any]]:
    """Long table: (run, final_step, metric, h_eff, value); h_eff None for training loss."""
    rows = []
    for r in runs:
        if r.final_train_loss is not None:
            rows.append({"run": r.name, "final_step": r.final_step, "metric": "train/loss",
                         "h_eff": None, "value": r.final_train_loss})
        for h, v in sorted(r.val_loss.items()):
            rows.append({"run": r.name, "final_step": r.final_step, "metric": "val/loss",
                         "h_eff": h, "value": v})
        for key, per_h in sorted(r.accuracy.items()):
            for h, v in sorted(per_h.items()):
                rows.append({"run": r.name, "final_step": r.final_step, "metric": key,
                             "h_eff": h, "value": v})
    return rows


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def summary_markdown(runs: Sequence[RunResults]) -> str:
    """Tables of validation loss and accuracy per variant × H_eff, plus plain findings."""
    hs = sorted({h for r in runs for h in r.val_loss})
    lines = ["# Variant comparison", "",
             "Final snapshot of each variant. Validation loss in nats/token (lower is better); "
             "accuracy is each task's main metric.", "",
             "## Validation loss by test-time loops (H_eff)", "",
             "| run | step | final train loss | " + " | ".join(f"H_eff={h}" for h in hs) + " |",
             "|---|---|---|" + "---|" * len(hs)]
    for r in runs:
        cells = [_fmt(r.val_loss.get(h)) for h in hs]
        lines.append(f"| {r.name} | {r.final_step} | {_fmt(r.final_train_loss)} | "
                     + " | ".join(cells) + " |")
    tasks = sorted({k for r in runs for k in r.accuracy})
    for task in tasks:
        th = sorted({h for r in runs for h in r.accuracy.get(task, {})})
        lines += ["", f"## {task}", "", "| run | " + " | ".join(f"H_eff={h}" for h in th) + " |",
                  "|---|" + "---|" * len(th)]
        for r in runs:
            per_h = r.accuracy.get(task, {})
            lines.append(f"| {r.name} | " + " | ".join(_fmt(per_h.get(h)) for h in th) + " |")
    lines += ["", "## Findings", ""]
    for r in runs:
        ordered = [r.val_loss[h] for h in sorted(r.val_loss)]
        best_h = min(r.val_loss, key=lambda h: (r.val_loss[h], h)) if r.val_loss else None
        deeper = all(b <= a for a, b in zip(ordered, ordered[1:], strict=False))
        lines.append(f"- **{r.name}**: best validation loss at H_eff={best_h}; more loops at test "
                     f"time {'never hurt' if deeper else 'do not always help'} "
                     f"(loss {' → '.join(_fmt(v) for v in ordered)}).")
    if hs and runs:
        best = {h: min(runs, key=lambda r: r.val_loss.get(h, float("inf"))).name for h in hs}
        lines.append("- Lowest validation loss per H_eff: "
                     + ", ".join(f"H_eff={h}: {name}" for h, name in best.items()) + ".")
    return "\n".join(lines) + "\n"


def plot_comparison(runs: Sequence[RunResults], out_dir: Path) -> list[Path]:
    """``loss_vs_heff.png``, ``accuracy_vs_heff.png`` and ``train_loss.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return [_save(plot(plt, runs), out_dir / name) for name, plot in (
        ("loss_vs_heff.png", _plot_loss_vs_heff), ("accuracy_vs_heff.png", _plot_accuracy),
        ("train_loss.png", _plot_train_loss))]


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_loss_vs_heff(plt: Any, runs: Sequence[RunResults]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    for r in runs:
        hs = sorted(r.val_loss)
        ax.plot(hs, [r.val_loss[h] for h in hs], marker="o", label=r.name)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="test-time loops H_eff", ylabel="validation loss (nats/token)",
           title="final snapshot: loss vs H_eff")
    ax.legend()
    return fig


def _plot_accuracy(plt: Any, runs: Sequence[RunResults]) -> Any:
    tasks = sorted({k for r in runs for k in r.accuracy})
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(4 * max(len(tasks), 1), 3.6),
                             constrained_layout=True, squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=False):
        for r in runs:
            per_h = r.accuracy.get(task, {})
            hs = sorted(per_h)
            ax.plot(hs, [per_h[h] for h in hs], marker="o", label=r.name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("H_eff")
        ax.set_title(task, fontsize="small")
        ax.legend(fontsize="small")
    axes[0][0].set_ylabel("accuracy")
    return fig


def _plot_train_loss(plt: Any, runs: Sequence[RunResults]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    for r in runs:
        if r.train_curve:
            steps, losses = zip(*r.train_curve, strict=True)
            ax.plot(steps, losses, label=r.name, linewidth=1)
    ax.set(xlabel="optimizer step", ylabel="training loss", title="training loss")
    ax.legend()
    return fig


def compare_runs(inputs: Mapping[str, Mapping[str, Path]], out_dir: Path) -> list[dict[str, Any]]:
    """``inputs``: run → {"heff": parquet, "bench": final bench JSON, "metrics": jsonl}.

    Writes ``summary.md``, ``summary.parquet`` and the plots into ``out_dir``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    runs = [load_run_results(name, Path(p["heff"]), Path(p["bench"]), Path(p["metrics"]))
            for name, p in inputs.items()]
    rows = comparison_rows(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = ("run", "final_step", "metric", "h_eff", "value")
    pq.write_table(pa.table({c: [r[c] for r in rows] for c in columns}),
                   out_dir / "summary.parquet")
    (out_dir / "summary.md").write_text(summary_markdown(runs))
    plot_comparison(runs, out_dir)
    return rows
