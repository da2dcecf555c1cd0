"""Where the files of a run live: the one module that knows the run directory's paths.

::

    {results}/
      mlflow.db  .tracking/store.json        # default tracking store; its creation marker
      .workflow_lock.json  demo_time.json    # the workflow using it; `make demo`'s wall time
      data/{data_id}/                        # one pack per distinct data config
      compare/                               # cross-run table and plots
      {run}/
        tracking.json  tracking_outbox.jsonl  tracking_outbox.sync.json
        tracking_files/                      # configs, headline.json, parent_running.json, finished.json
        snapshots/step_{step:07d}/           # kept snapshots
        snapshots/transient/step_{step:07d}/  # temporary ones (Snakemake temp())
        snapshots/index.json  snapshots/final  snapshots/best/
        snapshots/retention.json             # where each written snapshot went (kept or not)
        specs/{digest}.yaml                  # the run's completed config, one per digest
        train/metrics.jsonl  train/spike_events.jsonl  train/rollback.json  tensorboard/
        train/owners.json  train/lease.json  # loose snapshots' logs; the job training it now
        train/resume/step_{step:07d}/          # resume point, or the finished segment (links)
        train/launch/step_{step:07d}.yaml      # config read by a multi-process job's workers
        train/anchors/step_{step:07d}.tsv      # a long temporary chain's anchor (its benchmark)
        eval/heff/step_{step:07d}.json  eval/heff{,_adaptive}.{parquet,png}
        eval/trajectories/step_{step:07d}/trajectories.{json,png}   # opt-in: `snakemake trajectories`
        bench/step_{step:07d}.json  bench/tasks_step_{step:07d}/  bench/summary.parquet
        bench/accuracy_vs_heff.png
        export/                              # final snapshot in the Hugging Face format
    logs/{rule}/{run}[/transient]/step_{step:07d}.log   logs/{rule}/{run}.log   logs/{rule}.log
    logs/benchmarks/{rule}/{run}[/transient]/step_{step:07d}.tsv   (Snakemake benchmark:)

The Snakefile, :class:`~pipeline_lib.workflow.plan.WorkflowPlan`, the trainer, the stages,
tracking and the CLI ask a :class:`RunLayout` (or :class:`ResultsLayout`) for a path;
workflow scripts receive every path from their rule. A step is an int (``step_0000250``)
or, for a Snakemake pattern, a wildcard string used as is (``"{step}"`` → ``step_{step}``);
a run name may likewise be ``"{run}"``. Standard library only: the Snakefile imports it on
every call, dry runs included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SNAPSHOTS_DIR = "snapshots"
TEMP_SNAPSHOTS_DIR = "transient"  # temporary snapshots, under snapshots/
BEST_DIR = "best"  # the best snapshot's copy (checkpoint.best), under snapshots/
INDEX_FILE = "index.json"  # the kept snapshots (checkpoint.index), under snapshots/
FINAL_LINK = "final"  # beside the index: a link to the last kept snapshot
SPECS_DIR = "specs"  # the run's completed configs by digest (spec.run_spec)
RETENTION_FILE = "retention.json"  # how each written snapshot was kept (spec.retention)
TRACKING_JSON = "tracking.json"
TRACKING_LOCK = ".tracking.lock"
TRACKING_FILES_DIR = "tracking_files"  # resolved configs logged as parent-run artifacts
OUTBOX_FILE = "tracking_outbox.jsonl"
OUTBOX_SYNC_STATE = "tracking_outbox.sync.json"
OUTBOX_SYNC_LOCK = "tracking_outbox.sync.lock"
TRAJECTORIES_JSON = "trajectories.json"  # the latent-trajectory result (evaluate.trajectories)
TRAJECTORIES_FIGURE = "trajectories.png"
LOGS_DIR = Path("logs")  # relative to the working directory (Snakemake's workdir)
JOB_BENCHMARKS_DIR = LOGS_DIR / "benchmarks"


def step_dir_name(step: int | str) -> str:
    """``step_{step:07d}``: the directory of the snapshot taken after ``step`` optimizer
    steps (a string, e.g. the wildcard ``"{step}"``, is used as is)."""
    return f"step_{step:07d}" if isinstance(step, int) else f"step_{step}"


def job_log(rule: str, name: str | None = None) -> Path:
    """``logs/{rule}/{name}.log``: the ``log:`` of one Snakemake job (``logs/{rule}.log``
    for a rule with one job)."""
    return LOGS_DIR / f"{rule}.log" if name is None else LOGS_DIR / rule / f"{name}.log"


def job_benchmark(rule: str, name: str) -> Path:
    """``logs/benchmarks/{rule}/{name}.tsv``: the ``benchmark:`` file of one Snakemake job."""
    return JOB_BENCHMARKS_DIR / rule / f"{name}.tsv"


def job_benchmarks(rule: str, name: str) -> list[Path]:
    """The benchmark TSVs of ``rule``'s jobs named ``name`` or under ``name/`` (a run's
    steps), as far as their jobs have finished."""
    root = JOB_BENCHMARKS_DIR / rule
    return sorted(root.glob(f"{name}*.tsv")) + sorted((root / name).rglob("*.tsv"))


@dataclass(frozen=True)
class ResultsLayout:
    """The results directory: data packs, runs, the cross-run comparison, the store marker."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    def run(self, name: str) -> RunLayout:
        return RunLayout(self.root, name)

    def data_dir(self, data_id: str) -> Path:
        return self.root / "data" / data_id

    @property
    def compare_dir(self) -> Path:
        return self.root / "compare"

    @property
    def retrofit_plan_dir(self) -> Path:
        """``retrofit-plan``'s output for the experiment (``make retrofit`` writes it; the
        results section shows its table and figure when it is there)."""
        return self.compare_dir / "retrofit_plan"

    @property
    def demo_time(self) -> Path:
        """Wall time of ``make demo`` (written by the Makefile, read by ``make results``)."""
        return self.root / "demo_time.json"

    @property
    def workflow_lock(self) -> Path:
        """The Snakemake workflow using this directory now (workflow.results_lock)."""
        return self.root / ".workflow_lock.json"

    @property
    def tracking_marker(self) -> Path:
        """Written once the tracking store and experiment exist (rule tracking_store)."""
        return self.root / ".tracking" / "store.json"

    def run_dirs_with(self, file_name: str) -> list[Path]:
        """Run directories holding ``file_name`` (e.g. :data:`OUTBOX_FILE`)."""
        return sorted(p.parent for p in self.root.glob(f"*/{file_name}"))


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run: ``{results}/{run}/…``, its logs and benchmark TSVs."""

    results: Path
    run: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "results", Path(self.results))

    @classmethod
    def at(cls, run_dir: str | Path) -> RunLayout:
        """The layout whose run directory is ``run_dir`` (any directory will do)."""
        run_dir = Path(run_dir)
        return cls(run_dir.parent, run_dir.name)

    @property
    def run_dir(self) -> Path:
        return self.results / self.run

    # ------------------------------------------------------------------ snapshots

    @property
    def snapshots_dir(self) -> Path:
        return self.run_dir / SNAPSHOTS_DIR

    @property
    def temp_snapshots_dir(self) -> Path:
        return self.snapshots_dir / TEMP_SNAPSHOTS_DIR

    def snapshot(self, step: int | str, *, kept: bool = True) -> Path:
        """Kept snapshots at ``snapshots/step_…``, temporary ones under ``snapshots/transient/``."""
        return (self.snapshots_dir if kept else self.temp_snapshots_dir) / step_dir_name(step)

    @property
    def best(self) -> Path:
        return self.snapshots_dir / BEST_DIR

    @property
    def index(self) -> Path:
        return self.snapshots_dir / INDEX_FILE

    @property
    def retention(self) -> Path:
        """Where each snapshot written was put, kept or temporary (spec.retention)."""
        return self.snapshots_dir / RETENTION_FILE

    # ------------------------------------------------------------------ training logs

    @property
    def train_dir(self) -> Path:
        return self.run_dir / "train"

    @property
    def metrics(self) -> Path:
        return self.train_dir / "metrics.jsonl"

    @property
    def spike_log(self) -> Path:
        return self.train_dir / "spike_events.jsonl"

    @property
    def log_owners(self) -> Path:
        """The loose snapshots whose segments wrote this directory's training logs."""
        return self.train_dir / "owners.json"

    def resume_point(self, step: int | str) -> Path:
        """A stopped segment's resume point, or the finished one's files (train.finished):
        outside the job's outputs; only a later job of that segment reads it."""
        return self.train_dir / "resume" / step_dir_name(step)

    @property
    def lease(self) -> Path:
        """Who is training this run now (a SLURM job or a process): checked before a segment
        trains, so a run is never trained by two jobs at once (pipeline_lib.train.lease)."""
        return self.train_dir / "lease.json"

    def launch_config(self, step: int | str) -> Path:
        """The resolved config the workers of a multi-process segment job ending at ``step``
        read: in the run directory, which every node of a multi-node job sees (a node-local
        temporary directory would not be); removed when the job ends."""
        return self.train_dir / "launch" / f"{step_dir_name(step)}.yaml"

    def anchor(self, step: int | str) -> Path:
        """The anchor of the temporary segment ending at ``step``: a copy of its benchmark
        record, a target that keeps Snakemake's resolution of long temporary chains short
        (:func:`pipeline_lib.spec.snapshots.anchor_steps`)."""
        return self.train_dir / "anchors" / f"{step_dir_name(step)}.tsv"

    @property
    def rollback_record(self) -> Path:
        return self.train_dir / "rollback.json"

    @property
    def tensorboard(self) -> Path:
        return self.run_dir / "tensorboard"

    @property
    def specs_dir(self) -> Path:
        return self.run_dir / SPECS_DIR

    def spec(self, digest: str) -> Path:
        """The run's completed config of digest ``digest``: written by the Snakemake call
        that planned it, never rewritten with other content (spec.run_spec)."""
        return self.specs_dir / f"{digest}.yaml"

    # ------------------------------------------------------------------ tracking

    @property
    def tracking_json(self) -> Path:
        return self.run_dir / TRACKING_JSON

    @property
    def tracking_lock(self) -> Path:
        return self.run_dir / TRACKING_LOCK

    @property
    def tracking_files(self) -> Path:
        return self.run_dir / TRACKING_FILES_DIR

    @property
    def tracking_ready(self) -> Path:
        """Written last by rule ``track_init`` (parent run and pack child logged): what the
        stages wait for. Its job's only output, and it appears whole (atomic rename) at the
        job's end, so an interrupted ``track_init`` leaves no output that Snakemake could
        take as incomplete (an incomplete output read through ``ancient()`` cuts the rest of
        the pipeline out of the next run's job graph, Snakemake 9)."""
        return self.tracking_files / "tracking_ready.json"

    @property
    def parent_config(self) -> Path:
        """The config hash the parent run was last brought up to (rule ``track_config``)."""
        return self.tracking_files / "parent.json"

    @property
    def headline_versions(self) -> Path:
        """The version and timestamp of each headline group on the parent run
        (:mod:`pipeline_lib.tracking.headline`)."""
        return self.tracking_files / "headline.json"

    @property
    def parent_open(self) -> Path:
        """Present while the parent run is RUNNING for a pipeline (a stage started it; rule
        ``track_done`` or the Snakefile's onsuccess/onerror close it)."""
        return self.tracking_files / "parent_running.json"

    @property
    def parent_done(self) -> Path:
        """Written by rule ``track_done`` once every target of the run is built."""
        return self.tracking_files / "finished.json"

    @property
    def outbox(self) -> Path:
        return self.run_dir / OUTBOX_FILE

    @property
    def outbox_sync_state(self) -> Path:
        return self.run_dir / OUTBOX_SYNC_STATE

    @property
    def outbox_sync_lock(self) -> Path:
        return self.run_dir / OUTBOX_SYNC_LOCK

    # ------------------------------------------------------------------ evaluation, benchmarks

    @property
    def eval_dir(self) -> Path:
        return self.run_dir / "eval"

    def heff_result(self, step: int | str) -> Path:
        return self.eval_dir / "heff" / f"{step_dir_name(step)}.json"

    @property
    def heff_table(self) -> Path:
        return self.eval_dir / "heff.parquet"

    @property
    def heff_plot(self) -> Path:
        return self.eval_dir / "heff.png"

    @property
    def adaptive_table(self) -> Path:
        return self.eval_dir / "heff_adaptive.parquet"

    @property
    def adaptive_plot(self) -> Path:
        return self.eval_dir / "heff_adaptive.png"

    @property
    def label_table(self) -> Path:
        """Label accuracy per level and H_eff (labelled packs; empty otherwise)."""
        return self.eval_dir / "heff_labels.parquet"

    @property
    def label_plot(self) -> Path:
        return self.eval_dir / "heff_labels.png"

    def trajectories_dir(self, step: int | str) -> Path:
        """The latent trajectories of one snapshot (rule eval_trajectories, opt-in)."""
        return self.eval_dir / "trajectories" / step_dir_name(step)

    @property
    def bench_dir(self) -> Path:
        return self.run_dir / "bench"

    def bench_result(self, step: int | str) -> Path:
        return self.bench_dir / f"{step_dir_name(step)}.json"

    def bench_tasks(self, step: int | str) -> Path:
        """Scratch task files of one snapshot's benchmarks (a Snakemake temp() output)."""
        return self.bench_dir / f"tasks_{step_dir_name(step)}"

    @property
    def bench_table(self) -> Path:
        return self.bench_dir / "summary.parquet"

    @property
    def bench_plot(self) -> Path:
        return self.bench_dir / "accuracy_vs_heff.png"

    @property
    def export_dir(self) -> Path:
        """The final snapshot in the Hugging Face format (rule export)."""
        return self.run_dir / "export"

    # ------------------------------------------------------------------ job logs, benchmark TSVs

    @property
    def init_dir(self) -> Path:
        """The snapshot imported from ``model.init_from`` (the first segment warm-starts
        from it)."""
        return self.run_dir / "init"

    def _job_name(self, step: int | str | None, kept: bool) -> str:
        if step is None:
            return self.run
        return "/".join([self.run, *([] if kept else [TEMP_SNAPSHOTS_DIR]), step_dir_name(step)])

    def log(self, rule: str, step: int | str | None = None, *, kept: bool = True) -> Path:
        """``logs/{rule}/{run}.log``, or per step ``logs/{rule}/{run}[/transient]/step_….log``."""
        return job_log(rule, self._job_name(step, kept))

    def benchmark(self, rule: str, step: int | str | None = None, *, kept: bool = True) -> Path:
        """The Snakemake ``benchmark:`` TSV of one job, under ``logs/benchmarks/{rule}/``."""
        return job_benchmark(rule, self._job_name(step, kept))

    def benchmarks(self, rule: str) -> list[Path]:
        """Every benchmark TSV of ``rule`` for this run (written when its jobs finished)."""
        return job_benchmarks(rule, self.run)


def snapshots_dir_of(snapshot: str | Path) -> Path:
    """The snapshots directory ``snapshot`` belongs to: ``{run}/snapshots`` for
    ``{run}/snapshots[/transient]/step_…``, else the snapshot's parent (a loose snapshot)."""
    parent = Path(snapshot).parent
    if parent.name == TEMP_SNAPSHOTS_DIR and parent.parent.name == SNAPSHOTS_DIR:
        return parent.parent
    return parent


def run_dir_of(snapshot: str | Path) -> Path:
    """The run directory of ``snapshot``: ``{run}`` for ``{run}/snapshots[/transient]/step_…``,
    else the snapshot's parent (a loose snapshot keeps its run-level files beside it)."""
    root = snapshots_dir_of(snapshot)
    return root.parent if root.name == SNAPSHOTS_DIR else root
