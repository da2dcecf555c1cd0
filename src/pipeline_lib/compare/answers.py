"""Accuracy against compute per answer: samples × depth, compared at equal cost.

A generative task's bench JSON records, per depth setting (each fixed H_eff, each adaptive
exit), the loops computed per generated answer (``loops_per_answer``: every generated
token's loops summed, the prompt's prefill not counted; :mod:`pipeline_lib.bench.loops_used`)
and, when the task samples several answers, its sampled scores (pass@k, maj@k, lm-eval's
filters: :mod:`pipeline_lib.bench.sampled`), each with the answers it rests on (``samples``)
and so its compute per answer, ``samples`` × loops per answer. The task's own metric rests on
one answer. :func:`read_answers` lines these up per task so that, say, maj@8 at H_eff 1 and
one answer at H_eff 8 sit side by side at (about) the same compute: :func:`answers_table` in
``compare/summary.md``, :func:`plot_accuracy_vs_compute` (``compare/accuracy_vs_compute.png``)
and :func:`answer_rows` (``compare/summary.parquet``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

COMPUTE_PLOT = "accuracy_vs_compute.png"


@dataclass(frozen=True)
class AnswerPoint:
    """One score of a task at one depth setting, with the compute behind each answer."""

    score: str  # the task's own metric (one answer) or a sampled score's label (maj@5, …)
    setting: str  # "4" (fixed H_eff) or "adaptive:T:MAX", as the bench JSON keys it
    h_eff: int  # the depth, or an adaptive exit's MAX
    samples: int  # sampled answers the score rests on
    loops_per_answer: float  # samples × loops computed per sampled answer
    value: float
    n: int | None = None
    ci_low: float | None = None
    ci_high: float | None = None

    @property
    def depth(self) -> str:
        return f"H_eff={self.setting}" if self.setting.isdigit() else self.setting


def _settings(info: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """(key, depth, scores) of every setting: each fixed H_eff, each adaptive exit (its MAX)."""
    for h, scores in info.get("h_eff", {}).items():
        yield h, int(h), scores
    for label, scores in (info.get("adaptive") or {}).items():
        yield label, int(label.rsplit(":", 1)[-1]), scores


def read_answers(bench: Mapping[str, Any]) -> dict[str, list[AnswerPoint]]:
    """``task`` → every score with a compute per answer (generative tasks; none for a bench
    JSON from before it was recorded), ordered by compute."""
    out: dict[str, list[AnswerPoint]] = {}
    for task, info in bench.get("tasks", {}).items():
        metric = info.get("metric")
        for setting, h, scores in _settings(info):
            per_answer = scores.get("loops_per_answer")
            if per_answer is None:
                continue
            if metric in scores.get("overall", {}):
                ci = scores.get("overall_ci", {}).get(metric, {})
                out.setdefault(task, []).append(AnswerPoint(
                    metric, setting, h, 1, float(per_answer), float(scores["overall"][metric]),
                    ci.get("n"), ci.get("ci_low"), ci.get("ci_high")))
            for label, e in (scores.get("sampled") or {}).items():
                out.setdefault(task, []).append(AnswerPoint(
                    label, setting, h, int(e["samples"]), float(e["loops_per_answer"]),
                    float(e["value"]), e.get("n"), e.get("ci_low"), e.get("ci_high")))
    return {t: sorted(p, key=lambda x: (x.loops_per_answer, x.samples)) for t, p in out.items()}


def samples_more_than_once(answers: Mapping[str, Sequence[AnswerPoint]]) -> bool:
    """Whether some score rests on several sampled answers (what the table and figure are for)."""
    return any(p.samples > 1 for points in answers.values() for p in points)


def answer_rows(answers: Mapping[str, Sequence[AnswerPoint]]
                ) -> Iterator[tuple[str, int, float, int | None, float | None, float | None]]:
    """(metric, h_eff, value, n, ci_low, ci_high) rows of the comparison table:
    ``{task}/{score}`` for the sampled scores (the own metric has its rows already) and
    ``{task}/{score}/loops_per_answer`` (every score; n = the answers it rests on),
    ``_{adaptive}`` appended under an adaptive exit."""
    for task, points in sorted(answers.items()):
        for p in points:
            suffix = "" if p.setting.isdigit() else f"_{p.setting}"
            if p.samples > 1 or "@" in p.score or "/" in p.score:
                yield f"{task}/{p.score}{suffix}", p.h_eff, p.value, p.n, p.ci_low, p.ci_high
            yield (f"{task}/{p.score}/loops_per_answer{suffix}", p.h_eff, p.loops_per_answer,
                   p.samples, None, None)


def _cell(p: AnswerPoint) -> str:
    text = f"{p.value:.3f}"
    if p.ci_low is not None and p.ci_high is not None:
        text += f" [{p.ci_low:.2f}, {p.ci_high:.2f}]"
    return text


def answers_table(runs: Sequence[Any], level: int = 2) -> list[str]:
    """One row per variant × task × score × depth setting, ordered by compute per answer;
    empty unless some variant sampled several answers per question."""
    if not any(samples_more_than_once(r.answers) for r in runs):
        return []
    lines = [f"{'#' * level} Accuracy against compute per answer", "",
             "Generative tasks, all levels. Compute per answer: the sampled answers a score "
             "rests on × the loops computed per sampled answer (every generated token's loops, "
             "the final EOS included; the prompt's prefill not counted), so k samples at H_eff "
             "h and one sample at H_eff k·h cost about the same. pass@k: the unbiased "
             "estimator from all sampled answers, 95% bootstrap interval over questions; maj@k "
             "and one answer: 95% Wilson interval.", "",
             "| run | task | score | depth | samples | loops per answer | accuracy [95%] |",
             "|---|---|---|---|---|---|---|"]
    for task in sorted({t for r in runs for t in r.answers}):
        for r in runs:
            for p in r.answers.get(task, []):
                lines.append(f"| {r.name} | {task} | {p.score} | {p.depth} | {p.samples} | "
                             f"{p.loops_per_answer:.1f} | {_cell(p)} |")
    return lines


MARKERS = {"pass": "^", "maj": "s"}  # the own metric (one answer): circles; filters: diamonds


def _marker(score: str, own: bool) -> str:
    if own:
        return "o"
    return MARKERS.get(score.split("@")[0], "D")


def plot_accuracy_vs_compute(plt: Any, runs: Sequence[Any]) -> Any:
    """Accuracy against compute per answer (log scale), one panel per generative task: per
    variant and score a line through its depth settings (each point labelled with its
    depth), circles for one answer, squares for maj@k, triangles for pass@k, diamonds for
    other filters; bars: 95% intervals."""
    tasks = sorted({t for r in runs for t in r.answers})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 4.2),
                             constrained_layout=True, squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for i, r in enumerate(runs):
            points = r.answers.get(task, [])
            for score in dict.fromkeys(p.score for p in points):
                pts = [p for p in points if p.score == score]
                ax.errorbar([p.loops_per_answer for p in pts], [p.value for p in pts],
                            yerr=[[p.value - (p.ci_low if p.ci_low is not None else p.value)
                                   for p in pts],
                                  [(p.ci_high if p.ci_high is not None else p.value) - p.value
                                   for p in pts]],
                            fmt=_marker(score, pts[0].samples == 1 and "@" not in score) + "-",
                            color=f"C{i}", capsize=3, linewidth=1,
                            label=f"{r.name}: {score} ({pts[0].samples} answer(s))")
                for p in pts:
                    ax.annotate(p.depth.replace("H_eff=", "H"), (p.loops_per_answer, p.value),
                                textcoords="offset points", xytext=(4, 4), fontsize=6)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="loops computed per answer (samples × loops per sample)",
               title=f"{task} (95% intervals)")
        ax.legend(fontsize="x-small")
    axes[0][0].set_ylabel("accuracy, all levels")
    fig.suptitle("accuracy vs compute per answer: samples × depth", fontsize="medium")
    return fig
