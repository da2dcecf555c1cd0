"""What each variant contributes to the comparison: loading its outputs and the long table.

Per variant it reads the final snapshot's H_eff sweep (``eval/heff.parquet``), the final
benchmark JSON (``bench/step_….json``, with every example's score per H_eff by lm-eval
``doc_id``, the scores under adaptive exit with the mean loops used and computed, and what
each setting spent: :mod:`.spent`), the training curve (``train/metrics.jsonl``) and the snapshot's config
(parameters, forward FLOPs per token at the training loop count, core blocks and loops: the
variant's kind in the depth check).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..evaluate.heff_summary import write_parquet
from ..model.loop_sampling import deepest_loops
from ..spec.config_load import load_config
from ..spec.layout import RunLayout
from ..spec.size import flops_per_token, param_count
from .answers import AnswerPoint, answer_rows, read_answers
from .spent import Spent, read_spent, spent_rows

log = logging.getLogger(__name__)
TAIL_STEPS = 10  # final training loss = mean over the last this many logged steps
VAL_LOSS_KEY = re.compile(r"val/loss_h(\d+)")  # the trainer's validation after H loops
COLUMNS = ("run", "final_step", "metric", "h_eff", "level", "value", "n", "stderr", "ci_low",
           "ci_high")
_TYPES = {**dict.fromkeys(COLUMNS, "float64"), "run": "string", "metric": "string",
          **dict.fromkeys(("final_step", "h_eff", "level", "n"), "int64")}


@dataclass
class Score:
    """One number with its uncertainty: accuracy (n examples, 95% interval) or loss (n
    tokens, standard error)."""

    value: float
    n: int | None = None
    stderr: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None


@dataclass
class LoopScore:
    """A score under one adaptive exit, with the mean loops its tokens used and computed
    (``computed_loops`` None: a bench JSON from before it was recorded)."""

    score: Score
    mean_loops: float
    max_loops: int
    tokens: int | None = None
    computed_loops: float | None = None


@dataclass
class TaskSamples:
    """Every example's score of one task: what cross-variant paired comparisons rest on."""

    builtin: bool
    per_sample: dict[int, dict[str, float]]  # H_eff → {doc_id: score}
    levels: dict[str, int]  # doc_id → level (empty: no level breakdown)


@dataclass
class RunResults:
    """What one variant contributes to the comparison."""

    name: str
    final_step: int
    val_loss: dict[int, float]  # H_eff → validation loss at the final snapshot
    accuracy: dict[str, dict[int, float]]  # task/metric → H_eff → main metric, all levels
    train_curve: list[tuple[int, float]]  # (step, loss) of non-skipped steps
    loss_scores: dict[int, Score] = field(default_factory=dict)  # H_eff → loss ± stderr
    loss_paired: dict[int, dict[str, float]] = field(default_factory=dict)  # h → diff, lo, hi
    documents: int | None = None  # validation documents behind the loss
    # task/metric → level (None: all levels) → H_eff → Score
    scores: dict[str, dict[int | None, dict[int, Score]]] = field(default_factory=dict)
    # task/metric → paired records of the bench JSON (see bench.intervals)
    paired: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    baseline: int = 1  # H_eff the paired comparisons are against
    params: int | None = None
    flops_per_token: int | None = None  # forward, at the training loop count
    train_loops: int | None = None  # model.loops of the snapshot's config
    # the most loops a training step ran (model.loops, or loop_sampling.max_loops when
    # drawn): a variant with sampled loop counts is looped even at model.loops 1
    max_loops: int | None = None
    core_layers: int | None = None  # model.core_layers of the snapshot's config
    train_max_difficulty: int | None = None  # top training level (bench JSON)
    samples: dict[str, TaskSamples] = field(default_factory=dict)  # task/metric → examples
    # H_eff → loss ± stderr of the imported snapshot (step 0 of a model.init_from run)
    initial_scores: dict[int, Score] = field(default_factory=dict)
    # task/metric → adaptive:T:MAX → level (None: all levels) → score and mean loops used
    adaptive: dict[str, dict[str, dict[int | None, LoopScore]]] = field(default_factory=dict)
    adaptive_criterion: str | None = None  # bench.adaptive_criterion of the bench JSON
    # task/metric → setting ("4" or adaptive:T:MAX) → wall time and KV bytes (.spent)
    spent: dict[str, dict[str, Spent]] = field(default_factory=dict)
    labels: dict[str, Any] | None = None  # the final sweep's labels section (labelled tasks)
    # task → every score with its compute per answer (samples × loops; .answers)
    answers: dict[str, list[AnswerPoint]] = field(default_factory=dict)

    @property
    def final_train_loss(self) -> float | None:
        tail = [loss for _, loss in self.train_curve[-TAIL_STEPS:]]
        return sum(tail) / len(tail) if tail else None

    def beyond_range(self, task: str, level: int | None) -> bool:
        """``level`` of a built-in ``task`` lies above the variant's training range."""
        samples = self.samples.get(task)
        return (level is not None and self.train_max_difficulty is not None
                and samples is not None and samples.builtin
                and level > self.train_max_difficulty)


def read_json(path: Path, fix: str = "rerun the stage that writes it") -> Any:
    """A result's JSON, or a one-line DataError naming it and ``fix``."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} cannot be read as JSON ({exc}); {fix}") from None


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


def val_loss_curves(metrics_jsonl: Path) -> dict[int, list[tuple[int, float]]]:
    """``{H: [(step, validation loss after H loops), …]}`` from a run's training log: the
    ``val/loss_h{H}`` fields the trainer writes at every evaluation (``train.eval_interval``,
    segment ends); empty when the log is missing or has none (trained before they existed)."""
    curves: dict[int, list[tuple[int, float]]] = {}
    if not Path(metrics_jsonl).is_file():
        return curves
    for line in Path(metrics_jsonl).read_text().splitlines():
        rec = json.loads(line) if line.strip() else {}
        for key, value in rec.items():
            match = VAL_LOSS_KEY.fullmatch(key)
            if match and value is not None:
                curves.setdefault(int(match[1]), []).append((int(rec["step"]), float(value)))
    return dict(sorted(curves.items()))


@dataclass
class _ModelShape:
    params: int | None = None
    flops_per_token: int | None = None
    loops: int | None = None
    core_layers: int | None = None
    max_loops: int | None = None


def _model_shape(config_yaml: Path | None) -> _ModelShape:
    """Parameters, forward FLOPs per token at the training loops, loops, core blocks and the
    most loops a training step ran."""
    if config_yaml is None or not Path(config_yaml).is_file():
        log.warning("no snapshot config %s: the comparison lists no parameters, FLOPs or "
                    "variant kind", config_yaml)
        return _ModelShape()

    cfg = load_config(Path(config_yaml), base=None)
    return _ModelShape(param_count(cfg.model), flops_per_token(cfg.model, cfg.data.seq_len),
                       cfg.model.loops, cfg.model.core_layers,
                       deepest_loops(cfg.train.loop_sampling, cfg.model.loops))


def _is_builtin(task: str, info: Mapping[str, Any]) -> bool:
    return bool(info.get("builtin", task.startswith("loopline_")))


def _bench_scores(bench: Mapping[str, Any]) -> tuple[dict, dict, dict, dict]:
    """(accuracy, scores, paired, samples) of one bench JSON, keyed by ``task/metric``."""
    accuracy: dict[str, dict[int, float]] = {}
    scores: dict[str, dict[int | None, dict[int, Score]]] = {}
    paired: dict[str, list[dict[str, Any]]] = {}
    samples: dict[str, TaskSamples] = {}
    for task, info in bench.get("tasks", {}).items():
        metric = info.get("metric")
        key = f"{task}/{metric}"
        per_sample: dict[int, dict[str, float]] = {}
        for h, s in info["h_eff"].items():
            if metric not in s.get("overall", {}):
                continue
            value = float(s["overall"][metric])
            accuracy.setdefault(key, {})[int(h)] = value
            ci = s.get("overall_ci", {}).get(metric, {})
            scores.setdefault(key, {}).setdefault(None, {})[int(h)] = Score(
                value, ci.get("n"), None, ci.get("ci_low"), ci.get("ci_high"))
            for level, cell in s.get("levels", {}).items():
                scores[key].setdefault(int(level), {})[int(h)] = Score(
                    float(cell[metric]), cell.get("n"), None, cell.get("ci_low"),
                    cell.get("ci_high"))
            if "per_sample" in s:
                per_sample[int(h)] = {str(d): float(v) for d, v in s["per_sample"].items()}
        if key in accuracy:
            paired[key] = list(info.get("paired", []))
        if per_sample:
            levels = {str(d): int(lv) for d, lv in (info.get("sample_levels") or {}).items()}
            samples[key] = TaskSamples(_is_builtin(task, info), per_sample, levels)
    return accuracy, scores, paired, samples


def _adaptive_scores(bench: Mapping[str, Any]) -> dict[str, dict[str, dict[int | None, LoopScore]]]:
    """The adaptive-exit scores of one bench JSON (its tasks' ``adaptive`` sections)."""
    out: dict[str, dict[str, dict[int | None, LoopScore]]] = {}
    for task, info in bench.get("tasks", {}).items():
        metric = info.get("metric")
        for label, s in (info.get("adaptive") or {}).items():
            loops = s["loops"]
            if metric not in s.get("overall", {}):
                continue
            ci = s.get("overall_ci", {}).get(metric, {})
            cells = {None: LoopScore(Score(float(s["overall"][metric]), ci.get("n"), None,
                                           ci.get("ci_low"), ci.get("ci_high")),
                                     float(loops["mean"]), int(loops["max_loops"]),
                                     loops.get("tokens"), loops.get("computed_mean"))}
            for level, cell in s.get("levels", {}).items():
                lv = loops.get("levels", {}).get(level)
                if lv is not None and lv.get("mean") is not None:
                    cells[int(level)] = LoopScore(
                        Score(float(cell[metric]), cell.get("n"), None, cell.get("ci_low"),
                              cell.get("ci_high")),
                        float(lv["mean"]), int(loops["max_loops"]), lv.get("tokens"),
                        lv.get("computed_mean"))
            out.setdefault(f"{task}/{metric}", {})[label] = cells
    return out


def _labels(sweep_json: Path | None) -> dict[str, Any] | None:
    """The ``labels`` section of the final H_eff sweep (None: no sweep given, or unlabelled)."""
    if sweep_json is None or not Path(sweep_json).is_file():
        return None
    sweep = read_json(sweep_json)
    labels = sweep.get("labels")
    adaptive = {c: s["labels"] for c, s in (sweep.get("adaptive_by_criterion") or {}).items()
                if "labels" in s}
    return {**labels, "adaptive": adaptive} if labels and adaptive else labels


def load_run_results(name: str, heff_table: Path, bench_json: Path, metrics_jsonl: Path,
                     config_yaml: Path | None = None,
                     sweep_json: Path | None = None) -> RunResults:
    """Final-snapshot numbers of one variant. ``config_yaml`` defaults to the config of the
    snapshot the bench JSON names; ``sweep_json``: the final snapshot's H_eff sweep, whose
    ``labels`` section (labelled tasks) feeds :mod:`.labels`."""
    # pyarrow: CLI --help imports this module; only reading tables needs it
    import pyarrow.parquet as pq

    rows = pq.read_table(heff_table).to_pylist()
    if not rows:
        raise DataError(f"{heff_table} is empty; rerun summarize_heff for run {name}")
    final_step = max(r["step"] for r in rows)
    final = [r for r in rows if r["step"] == final_step]
    val_loss = {int(r["h_eff"]): float(r["loss"]) for r in final}
    loss_scores = {int(r["h_eff"]): Score(float(r["loss"]), r.get("tokens"), r.get("stderr"))
                   for r in final}
    initial_scores = {int(r["h_eff"]): Score(float(r["loss"]), r.get("tokens"), r.get("stderr"))
                      for r in rows if r["step"] == 0 and final_step > 0}
    loss_paired = {int(r["h_eff"]): {"diff": r["diff_vs_h1"], "lo": r["diff_lo"],
                                     "hi": r["diff_hi"]}
                   for r in final if r.get("diff_vs_h1") is not None}
    bench = read_json(bench_json)
    accuracy, scores, paired, samples = _bench_scores(bench)
    baselines = {info.get("paired_baseline") for info in bench.get("tasks", {}).values()}
    baselines.discard(None)
    if config_yaml is None and bench.get("snapshot"):
        config_yaml = Path(bench["snapshot"]) / "config.yaml"
    shape = _model_shape(config_yaml)
    return RunResults(name, final_step, val_loss, accuracy, _train_curve(metrics_jsonl),
                      loss_scores=loss_scores, loss_paired=loss_paired,
                      documents=final[0].get("documents"), scores=scores, paired=paired,
                      baseline=min(baselines) if baselines else min(val_loss),
                      params=shape.params, flops_per_token=shape.flops_per_token,
                      train_loops=shape.loops, core_layers=shape.core_layers,
                      max_loops=shape.max_loops,
                      train_max_difficulty=bench.get("train_max_difficulty"), samples=samples,
                      initial_scores=initial_scores, adaptive=_adaptive_scores(bench),
                      adaptive_criterion=(bench.get("bench") or {}).get("adaptive_criterion"),
                      spent=read_spent(bench), labels=_labels(sweep_json),
                      answers=read_answers(bench))


def run_dir_inputs(run_dir: Path) -> dict[str, Path]:
    """The inputs of :func:`load_run_results` inside a finished ``results/{run}`` directory:
    H_eff table, final bench JSON, training log, the final snapshot's config and its H_eff
    sweep."""
    layout = RunLayout.at(run_dir)
    if not Path(run_dir).is_dir() or not layout.snapshots_dir.is_dir():
        what = ("is a file" if Path(run_dir).is_file() else "does not exist"
                if not Path(run_dir).exists() else "has no snapshots/ folder")
        raise DataError(f"compare takes run directories (results/<run>, where training wrote "
                        f"snapshots/); {run_dir} {what}: pass the run directories to compare, "
                        "e.g. results/loop1 results/loop4")
    if not layout.index.is_file():
        raise DataError(f"{layout.index} is missing; finish training run {layout.run} first")
    final = int(read_json(layout.index)["final_step"])
    return {"heff": layout.heff_table, "bench": layout.bench_result(final),
            "metrics": layout.metrics, "config": layout.snapshot(final) / "config.yaml",
            "sweep": layout.heff_result(final)}


def load_runs(inputs: Mapping[str, Mapping[str, Path]]) -> list[RunResults]:
    """:func:`load_run_results` of every run of ``inputs`` (see ``compare_runs``), in order."""
    return [load_run_results(name, Path(p["heff"]), Path(p["bench"]), Path(p["metrics"]),
                             Path(p["config"]) if p.get("config") else None,
                             Path(p["sweep"]) if p.get("sweep") else None)
            for name, p in inputs.items()]


def comparison_rows(runs: Sequence[RunResults]) -> list[dict[str, Any]]:
    """Long table (:data:`COLUMNS`); h_eff None for training loss and model size, level None
    for whole-task scores; n = tokens for losses, examples for accuracies. Adaptive exits
    add ``{task}/{metric}_{adaptive}``, ``{task}/mean_loops_{adaptive}`` (loops used) and,
    where recorded, ``{task}/computed_loops_{adaptive}`` (loops computed; n = tokens) rows,
    whose h_eff is their MAX; what each setting spent adds the rows of
    :func:`.spent.spent_rows` (KV bytes per task, wall time per setting); compute per answer
    those of :func:`.answers.answer_rows` (sampled scores, and loops per answer with n = the
    answers sampled)."""
    rows = []

    def add(r: RunResults, metric: str, h: int | None, value: float, level: int | None = None,
            score: Score | None = None) -> None:
        s = score or Score(value)
        rows.append({"run": r.name, "final_step": r.final_step, "metric": metric, "h_eff": h,
                     "level": level, "value": value, "n": s.n, "stderr": s.stderr,
                     "ci_low": s.ci_low, "ci_high": s.ci_high})

    for r in runs:
        if r.params is not None:
            add(r, "model/params", None, float(r.params))
        if r.flops_per_token is not None:
            add(r, "model/flops_per_token", None, float(r.flops_per_token))
        if r.final_train_loss is not None:
            add(r, "train/loss", None, r.final_train_loss)
        for h, v in sorted(r.val_loss.items()):
            add(r, "val/loss", h, v, score=r.loss_scores.get(h))
        for key, per_h in sorted(r.accuracy.items()):
            by_level = r.scores.get(key, {})
            for h, v in sorted(per_h.items()):
                add(r, key, h, v, score=by_level.get(None, {}).get(h))
            for level in sorted(lv for lv in by_level if lv is not None):
                for h, s in sorted(by_level[level].items()):
                    add(r, key, h, s.value, level, s)
        for key, settings in sorted(r.adaptive.items()):
            task = key.rsplit("/", 1)[0]
            for label, cells in settings.items():
                for level, c in sorted(cells.items(), key=lambda x: (x[0] is not None, x[0])):
                    add(r, f"{key}_{label}", c.max_loops, c.score.value, level, c.score)
                    add(r, f"{task}/mean_loops_{label}", c.max_loops, c.mean_loops, level,
                        Score(c.mean_loops, c.tokens))
                    if c.computed_loops is not None:
                        add(r, f"{task}/computed_loops_{label}", c.max_loops, c.computed_loops,
                            level, Score(c.computed_loops, c.tokens))
        for metric, h, value in spent_rows(r.spent, r.adaptive):
            add(r, metric, h, value)
        for metric, h, value, n, lo, hi in answer_rows(r.answers):
            add(r, metric, h, value, score=Score(value, n, None, lo, hi))
    return rows


def write_table(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """``rows`` (:data:`COLUMNS`) as a parquet file with fixed column types."""
    write_parquet(rows, COLUMNS, _TYPES, path)
