"""What the Snakefile needs to know, computed once from the Snakemake config dict.

Runs (:class:`~pipeline_lib.workflow.run_plan.RunPlan`: the resolved spec and its digest,
which every job's params name, the signatures, segment ends and kept snapshot steps), data
ids, and the paths of each (from :mod:`pipeline_lib.spec.layout`). Kept snapshots are
outputs; the others are temporary outputs that Snakemake deletes once the next segment
consumed them, so a finished run re-run finds nothing to do; which is which is decided when a
snapshot is written (:mod:`pipeline_lib.spec.retention`). Torch-free and cheap: Snakemake
evaluates this on every call, dry runs included, and the per-segment functions once per
segment job: lookups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, PipelineError
from ..spec.config import DataConfig
from ..spec.config_load import DEFAULT_CONFIG_PATH, config_from_dict, merge_user_config
from ..spec.config_write import config_hash, to_dict
from ..spec.init_source import source_files
from ..spec.layout import ResultsLayout, RunLayout
from ..spec.run_spec import SpecRef, read_run_spec
from ..spec.signatures import bench_signature, config_signature, init_signature, precision_signature
from ..spec.snapshots import previous_end
from ..task_catalog import check_bench_tasks, user_task_inputs
from .cluster_resources import job_resources, job_threads, segment_time
from .resolve import DEFAULT_RUN, resolve_run
from .run_plan import RunPlan
from .run_specs import planned_digests, write_run_specs


def _check_results_dir(results: Path) -> None:
    """``experiment.results_dir`` must be a directory or not exist yet (nor a parent be a
    file): Snakemake would otherwise fail with a traceback while scanning for outputs."""
    for path in (results, *results.parents):
        if path.exists():
            if not path.is_dir():
                what = "is" if path == results else f"lies under {path}, which is"
                raise ConfigError(f"experiment.results_dir = {str(results)!r} {what} a file, "
                                  "not a directory; point it at a directory (created if "
                                  "missing)")
            return


class WorkflowPlan:
    """Runs, data packs and snapshot steps of one Snakemake invocation."""

    def __init__(self, config: Mapping[str, Any], source: str = "Snakemake config", *,
                 planned: Mapping[str, str] | None = None):
        self._planned = dict(planned or {})
        self.config = config_from_dict(config, source)
        self.results = Path(self.config.experiment.results_dir)
        _check_results_dir(self.results)
        self.layout = ResultsLayout(self.results)
        names = list(self.config.runs) or [DEFAULT_RUN]
        self.runs = {name: self._plan_run(name) for name in names}
        self._check_nodes()
        self._bench_inputs: dict[str, list[str]] = {}
        self._check_bench()

    def _check_nodes(self) -> None:
        """The rule's SLURM resources come from the base config: variants keep its nodes."""
        t = self.config.train
        for name, plan in self.runs.items():
            v = plan.config.train
            if ((v.nnodes, v.nproc, v.min_nnodes) != (t.nnodes, t.nproc, t.min_nnodes)
                    and max(v.nnodes, t.nnodes) > 1):
                raise ConfigError(f"runs.{name} sets train.nnodes × train.nproc = {v.nnodes} × "
                                  f"{v.nproc} (min_nnodes {v.min_nnodes}), the base config "
                                  f"{t.nnodes} × {t.nproc} (min_nnodes {t.min_nnodes}); the "
                                  "segment jobs' SLURM resources come from the base config, "
                                  "so set train.nnodes, nproc and min_nnodes there, not per run")

    def _check_bench(self) -> None:
        """bench.tasks and bench.include_path of every run, checked before any job starts."""
        checked: dict[tuple[tuple[str, ...], str], list[str]] = {}
        for name, plan in self.runs.items():
            bench = plan.config.bench
            key = (tuple(bench.tasks), bench.include_path)
            if key not in checked:
                where = f"runs.{name}.bench" if self.config.runs and (
                    to_dict(bench) != to_dict(self.config.bench)) else "bench"
                check_bench_tasks(bench, where)
                checked[key] = user_task_inputs(bench.include_path)
            self._bench_inputs[name] = checked[key]

    def _plan_run(self, name: str) -> RunPlan:
        """The run's :class:`RunPlan`: its spec resolved (:func:`resolve_run`), or, inside a
        cluster job, read from the file of the digest the main call ``planned`` for it (no
        pretrained-source or tokenizer file read again in every job; see
        :mod:`pipeline_lib.workflow.run_specs`)."""
        layout = self.layout.run(name)
        digest = self._planned.get(name)
        if digest is None:
            return RunPlan.of(resolve_run(self.config, name if self.config.runs else None),
                              layout)
        spec = read_run_spec(layout.run_dir, digest)
        if spec.name != name:
            raise ConfigError(f"{layout.spec(digest)} is the spec of run {spec.name!r}, not "
                              f"of {name!r}; run snakemake again, which writes the specs")
        return RunPlan.of(spec.with_tracking_uri(self.config.tracking.uri), layout, digest)

    def write_run_specs(self) -> list[str]:
        """Every run's ``{run}/specs/{digest}.yaml`` (where missing): what the jobs read."""
        return write_run_specs((p.spec, self.run_dir(n)) for n, p in self.runs.items())

    def spec_digests(self) -> dict[str, str]:
        """Each run's spec digest: what a cluster job's plan reads (``run_specs``)."""
        return {name: plan.digest for name, plan in self.runs.items()}

    def spec_ref(self, run: str) -> SpecRef:
        """``params.spec`` of every job of ``run``: the spec it reads and checks."""
        return self.runs[run].spec_ref

    def retention_notes(self) -> list[str]:
        """Where the kept snapshots differ from the snapshots settings, one line each."""
        return [note for plan in self.runs.values() for note in plan.retention_notes()]

    # ------------------------------------------------------------------ runs and data

    @property
    def run_names(self) -> list[str]:
        return list(self.runs)

    def data_config(self, data_id: str) -> DataConfig:
        for plan in self.runs.values():
            if plan.data_id == data_id:
                return plan.config.data
        raise KeyError(f"no run uses data pack {data_id}")

    def data_params(self, data_id: str) -> dict[str, Any]:
        """The data section as plain data (a Snakemake param: a change re-packs)."""
        return to_dict(self.data_config(data_id))

    def data_dir(self, run: str) -> str:
        return str(self.layout.data_dir(self.runs[run].data_id))

    def run_layout(self, run: str) -> RunLayout:
        """The paths of ``run`` (``"{run}"``: the patterns of every run, for rules)."""
        return self.layout.run(run)

    def run_dir(self, run: str) -> str:
        return str(self.layout.run(run).run_dir)

    # ------------------------------------------------------------------ snapshots

    def snapshot_path(self, run: str, step: int) -> str:
        """Kept snapshots at ``snapshots/step_…``, temporary ones under ``transient/``; step 0
        of a ``model.init_from`` run is its imported snapshot (``init/``)."""
        plan = self.runs[run]
        if step == 0 and self.has_init(run):
            return str(self.layout.run(run).init_dir)
        if step not in plan.previous_ends:
            raise ValueError(f"step {step} is not a segment end of run {run}")
        return str(self.layout.run(run).snapshot(step, kept=step in plan.kept_set))

    def _previous_end(self, run: str, step: int) -> int | None:
        ends = self.runs[run].previous_ends  # previous_end raises: not a segment end
        return ends[step] if step in ends else previous_end(self.runs[run].segment_ends, step)

    def previous_snapshot(self, run: str, step: int) -> list[str]:
        """The snapshot the segment ending at ``step`` resumes from ([] for the first)."""
        previous = self._previous_end(run, step)
        return [] if previous is None else [self.snapshot_path(run, previous)]

    def segment_inputs(self, run: str, step: int) -> dict[str, Any]:
        """Rule ``train_segment``'s inputs, from one call (Snakemake inspects every function
        it calls, and a run has thousands of segment jobs): data pack, the snapshot resumed
        ([] for the first) and the imported one warm-started from (init_from, first only)."""
        return {"data": self.data_dir(run), "previous": self.previous_snapshot(run, step),
                "init": self.init_snapshot(run, step)}

    def has_init(self, run: str) -> bool:
        """Whether ``run`` starts from a pretrained model (``model.init_from.source``)."""
        return bool(self.runs[run].config.model.init_from.source)

    def init_source(self, run: str) -> list[str]:
        """The pretrained source's files ([] without ``init_from``): inputs of rule
        ``import_init``, so a changed source is imported again."""
        if not self.has_init(run):
            return []
        return [str(p) for p in source_files(self.runs[run].config.model.init_from.source)]

    def init_snapshot(self, run: str, step: int) -> list[str]:
        """The imported snapshot the segment ending at ``step`` warm-starts from (first only)."""
        if not self.has_init(run) or self._previous_end(run, step) is not None:
            return []
        return [str(self.layout.run(run).init_dir)]

    def init_signature(self, run: str) -> str:
        """What determines the imported snapshot (source, model, seed): see
        :func:`pipeline_lib.spec.signatures.init_signature`."""
        return init_signature(self.runs[run].config)

    def final_snapshot(self, run: str) -> str:
        """The snapshot of the run's last segment (always kept): what rule export exports."""
        return self.snapshot_path(run, self.runs[run].final_step)

    def kept_snapshots(self, run: str) -> list[str]:
        return [self.snapshot_path(run, s) for s in self.runs[run].kept_steps]

    def anchors(self, run: str) -> list[str]:
        """The anchors of ``run``'s long temporary chains (rule ``segment_anchor``)."""
        layout = self.layout.run(run)
        return [str(layout.anchor(s)) for s in self.runs[run].anchor_steps]

    def segment_targets(self, run: str) -> list[str]:
        """Kept snapshots and anchors, in step order (the order Snakemake resolves them)."""
        plan = self.runs[run]
        marks = dict(zip(plan.kept_steps, self.kept_snapshots(run), strict=True))
        marks.update(zip(plan.anchor_steps, self.anchors(run), strict=True))
        return [marks[step] for step in sorted(marks)]

    def bench_steps(self, run: str) -> list[int]:
        plan = self.runs[run]
        return plan.kept_steps if plan.config.bench.snapshots == "kept" else [plan.final_step]

    # ------------------------------------------------------------------ targets

    def heff_results(self, run: str) -> list[str]:
        """The H_eff sweep of every kept snapshot of ``run``."""
        layout = self.layout.run(run)
        steps = ([0] if self.has_init(run) else []) + self.runs[run].kept_steps
        return [str(layout.heff_result(s)) for s in steps]

    def bench_results(self, run: str) -> list[str]:
        layout = self.layout.run(run)
        return [str(layout.bench_result(s)) for s in self.bench_steps(run)]

    def compare_inputs(self) -> dict[str, str]:
        """Per run: its H_eff table, its final snapshot's H_eff sweep (whose labels section
        feeds the labelled depth check), its final benchmark JSON and its snapshot index."""
        inputs = {}
        for run, plan in self.runs.items():
            layout = self.layout.run(run)
            inputs[f"{run}_heff"] = str(layout.heff_table)
            inputs[f"{run}_sweep"] = str(layout.heff_result(plan.final_step))
            inputs[f"{run}_bench"] = str(layout.bench_result(plan.final_step))
            inputs[f"{run}_index"] = str(layout.index)
        return inputs

    def metrics_files(self) -> dict[str, str]:
        """Per run: its training metrics (written beside the snapshots, not a rule output)."""
        return {run: str(self.layout.run(run).metrics) for run in self.runs}

    def run_targets(self, run: str) -> list[str]:
        """What one run's pipeline builds: kept snapshots (and anchors), index, H_eff and
        benchmark summaries, export, its parent run brought up to date with the config (the
        inputs of rule ``track_done``, which then ends the parent run)."""
        layout = self.layout.run(run)
        return self.segment_targets(run) + [str(p) for p in (
            layout.index, layout.heff_table, layout.heff_plot, layout.bench_table,
            layout.bench_plot, layout.export_dir, layout.parent_config)]

    def all_targets(self) -> list[str]:
        """Every run's targets (:meth:`run_targets`) and its finished parent run, and the
        comparison.

        The kept snapshots are targets themselves: Snakemake does not rerun a job whose
        outputs exist because one of its inputs was deleted (that is what lets ``temp()``
        snapshots go), so a kept snapshot that is only an input of ``snapshot_index`` could
        vanish unnoticed. As a target, a deleted one is rebuilt (from the previous kept
        snapshot, regenerating the temporary ones between), and so is what depends on it:
        the later segments resuming from it, its sweeps and benchmarks, the index.

        Snakemake resolves targets in turn, each recursively: they come in step order, with
        an anchor (a copy of its benchmark record, rule ``segment_anchor``) every 100th of a
        long run of temporary segments, so each chain ends at the previous target: no
        recursion limit. It needs the record, not the snapshot: that still goes once consumed.
        """
        targets = []
        for run in self.runs:
            targets += self.run_targets(run) + [str(self.layout.run(run).parent_done)]
        return targets + [str(self.layout.compare_dir / "summary.md")]

    # ------------------------------------------------------------------ resources

    def threads(self, family: str) -> int:
        """Threads of a ``train`` or ``eval`` job (Snakemake caps them at ``--cores``)."""
        return job_threads(self.config, family)

    def segment_time(self) -> dict[str, Any]:
        """A segment job's ``runtime`` and early SIGUSR1 (:func:`segment_time`): values when
        the runs agree (no call per job), else functions of the wildcards."""
        per_run = {name: segment_time(p.config) for name, p in self.runs.items()}
        if len({tuple(sorted(t.items())) for t in per_run.values()}) == 1:
            return next(iter(per_run.values()))
        return {k: (lambda wildcards, k=k: per_run[wildcards.run].get(k, ""))
                for k in {k for t in per_run.values() for k in t}}

    def cluster_resources(self, family: str) -> dict[str, Any]:  # see job_resources
        return job_resources(self.config, family)

    # ------------------------------------------------------------------ params

    def train_signature(self, run: str) -> str:
        """What determines the weights: :func:`~pipeline_lib.spec.signatures.train_signature`."""
        return self.runs[run].train_signature

    def config_signature(self, run: str) -> str:
        """Hash of the run's whole resolved config: a param of ``track_config``, so any
        config change brings the parent run up to date (config hash, changed params, config
        artifact)."""
        return config_signature(self.runs[run].config, self.runs[run].spec.vocab_size)

    def eval_signature(self, run: str) -> str:
        data = to_dict(self.runs[run].config.eval)
        return config_hash({**data, **precision_signature(self.runs[run].config)})

    def bench_signature(self, run: str) -> str:
        return bench_signature(self.runs[run].config)

    def bench_task_files(self, run: str) -> list[str]:
        """Files of the run's ``bench.include_path`` tasks (YAMLs, includes, data): inputs of
        the bench rule, so editing them reruns the benchmarks."""
        return self._bench_inputs[run]


def plan_for_snakemake(config: dict[str, Any], configfiles: Sequence[Any] = (),
                       overrides: Mapping[str, Any] | None = None, *,
                       in_job: bool = False) -> WorkflowPlan:
    """The Snakefile's plan, ``config`` rebuilt in place by loopline's rules (not Snakemake's
    recursive merge, which adds a later file's ``runs:`` to the earlier ones): the default ←
    ``configfiles`` in order, as the commands' ``--config A --config B`` ← ``overrides``
    (``--config``; without files ``config`` is all the user gave). A user error ends Snakemake
    with the one line the commands print (``error: …``, naming the file or the ``runs:``
    variant), never with a traceback or a dump of the JSON schema. ``in_job`` (a job's own
    Snakemake, a cluster job's): each run's spec is the one the main call exported
    (:func:`~pipeline_lib.workflow.run_specs.planned_digests`), where it did."""
    names = [_shown(Path(f)) for f in configfiles] + (["--config"] if overrides else [])
    try:
        last = (overrides or {}) if configfiles else config
        merged = merge_user_config(configfiles, DEFAULT_CONFIG_PATH, last, overrides)
        config.clear()
        config.update(merged)
        return WorkflowPlan(config, " + ".join(names) or "config/config.yaml",
                            planned=planned_digests() if in_job else None)
    except PipelineError as exc:
        raise SystemExit(f"error: {exc}") from None


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (as typed, mostly)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
