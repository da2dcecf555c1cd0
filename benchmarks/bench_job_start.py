"""A segment job's start-up, this tree against a baseline revision, side by side.

Start-up: from the start of the Snakemake call that runs the job to the start of the
stage's first step (the moment the first line of ``train/metrics.jsonl`` appears, less that
step's own ``step_time_s``): Snakemake's parse and plan, the job's spawn, the script's
imports, its config (before issue 28 every job planned the whole experiment again; now it
reads the spec file its params name, ``{run}/specs/{digest}.yaml``), the trainer's build.
Two ways a job starts:

- ``local``: ``snakemake --cores 1 TARGET``, the first segment's snapshot missing (local
  executor: the script runs in a child process);
- ``cluster``: the command a cluster executor runs on the node, ``snakemake --mode remote
  --target-jobs train_segment:run=r0,step=0000001 …`` (its own Snakemake parses the
  Snakefile and builds the plan before the job, from the specs the main call names in
  ``LOOPLINE_RUN_SPECS``, which a cluster job inherits; run here without a cluster).

The experiment has ``--runs`` variants of a tiny model (two one-step segments, every
snapshot kept, tracking off): the old path's cost grows with them. Each side gets its own
working directory, prepared once (pack, bookkeeping, the first segment trained as a
warm-up; the main call writes the runs' specs there); the measurements alternate between the
sides, best of ``--repeats``. Imported by :mod:`bench_plan` (its ``--baseline``); alone:
``python benchmarks/bench_job_start.py [--baseline REV] [--runs R] [--repeats N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
BASELINE = "e62e413"  # main before issue 28 (each job re-planned the experiment)
RUN, STEP = "r0", "0000001"
CONFIG = """experiment: {{name: bench-job-start, results_dir: results}}
data:
  sources: [{{type: reasoning, num_docs: 200, max_difficulty: 3}}]
  seq_len: 32
  epochs: 1
  val_fraction: 0.1
model: {{d_model: 32, n_heads: 2, loops: 2}}
train: {{total_steps: 2, steps_per_segment: 1, global_batch_rows: 8, micro_batch_rows: 8,
        warmup_steps: 1, eval_interval: 1, eval_rows: 8, sample_tokens: 4,
        spike: {{warmup_steps: 1}}}}
snapshots: {{keep_last: 2}}
tracking: {{enabled: false}}
runs: {{{runs}}}
"""


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """The tree of ``revision`` (``git archive``) in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="baseline-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


def _env(root: Path, work: Path | None = None) -> dict[str, str]:
    """The environment of a call: this tree's library, and in ``work`` the spec digests the
    main call hands its cluster jobs (each run's one spec file; none before they existed)."""
    specs = sorted(work.glob("results/*/specs/*.yaml")) if work is not None else []
    digests = ",".join(f"{p.parent.parent.name}={p.stem}" for p in specs)
    return {**os.environ, "PYTHONPATH": str(root / "src"), "LOOPLINE_RUN_SPECS": digests}


def _run(cmd: list[str], root: Path, work: Path) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(root), cwd=work)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr)[-3000:]}")


def _base(root: Path, work: Path) -> list[str]:
    return [str(SNAKEMAKE), "--snakefile", str(root / "Snakefile"), "--directory", str(work),
            "--configfile", str(work / "bench.yaml"), "--cores", "1"]


def prepare(root: Path, work: Path, runs: int) -> None:
    """The experiment's config, its pack and bookkeeping, the first segment trained once."""
    variants = ", ".join(f"r{i}: {{model: {{loops: {1 + i % 4}}}}}" for i in range(runs))
    work.mkdir(parents=True, exist_ok=True)
    (work / "bench.yaml").write_text(CONFIG.format(runs=variants))
    _run([*_base(root, work), SNAPSHOT], root, work)


SNAPSHOT = f"results/{RUN}/snapshots/step_{STEP}"  # as the rules spell it (relative)


def _command(root: Path, work: Path, how: str) -> list[str]:
    if how == "local":
        return [*_base(root, work), SNAPSHOT]
    return [*_base(root, work), "--mode", "remote", "--target-jobs",
            f"train_segment:run={RUN},step={STEP}", "--force", "--nolock", "--no-hooks",
            "--ignore-incomplete", "--retries", "0", "--quiet", "all"]


def start_up(root: Path, work: Path, how: str) -> float:
    """Seconds from the Snakemake call's start to the start of the segment's first step."""
    shutil.rmtree(work / SNAPSHOT, ignore_errors=True)
    shutil.rmtree(work / "results" / RUN / "train", ignore_errors=True)
    metrics = work / "results" / RUN / "train" / "metrics.jsonl"
    started = time.perf_counter()
    proc = subprocess.Popen(_command(root, work, how), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env(root, work), cwd=work)
    seen, line = None, ""
    while seen is None and proc.poll() is None:
        with contextlib.suppress(OSError):
            line = metrics.read_text().split("\n", 1)[0]
        if line.endswith("}"):
            seen = time.perf_counter()
        time.sleep(0.002)
    _, err = proc.communicate()
    if proc.returncode != 0 or seen is None:
        raise SystemExit(f"the {how} segment job failed or wrote no step:\n{err[-3000:]}")
    return seen - started - float(json.loads(line)["step_time_s"])


def job_start_rows(this: Path, baseline: Path, runs: int, repeats: int) -> list[dict]:
    """Best start-up of each side and way, alternating; ratio this / baseline."""
    with tempfile.TemporaryDirectory(prefix="job-start-") as tmp:
        works = {"this": Path(tmp) / "this", "baseline": Path(tmp) / "baseline"}
        roots = {"this": this, "baseline": baseline}
        for side in works:
            prepare(roots[side], works[side], runs)
        best = {(side, how): float("inf") for side in works for how in ("local", "cluster")}
        for _ in range(repeats):
            for how in ("local", "cluster"):
                for side in works:
                    best[side, how] = min(best[side, how],
                                          start_up(roots[side], works[side], how))
    return [{"measure": f"segment job start-up ({how})", "runs": runs,
             "wall_s": round(best["this", how], 2),
             "baseline_wall_s": round(best["baseline", how], 2),
             "ratio": round(best["this", how] / best["baseline", how], 2)}
            for how in ("local", "cluster")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with checkout(args.baseline) as baseline:
        rows = job_start_rows(ROOT, baseline, args.runs, args.repeats)
    for r in rows:
        print(f"{r['measure']:34} runs {r['runs']:3d}  this {r['wall_s']:6.2f} s  baseline "
              f"{r['baseline_wall_s']:6.2f} s  ratio {r['ratio']:.2f}")
    print(json.dumps({"benchmark": "job_start", "baseline": args.baseline, "rows": rows}))


if __name__ == "__main__":
    main()
